"""The worker pool's Finish replies: a worker starts its next job while the
last one's rest (a unit's fsyncs, in the data stage) runs, replies still come
back in job order, and a rest that fails is the same error a job's failure
is. Workers are fresh interpreters that import only what their jobs need,
and a worker whose parent was killed stops. Real worker processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from functools import partial

import psutil
import pytest

from gpt2.data.process_pool import Finish, TokenizeWorkerError, run_pool
from gpt2.errors import UserError

WAIT_S = 60
"""Far above the moment the next job starts: reaching it means no overlap."""

_started: dict[int, threading.Event] = {}


def _job(n: int, last: int) -> Finish:
    """Job n's first half marks it started; its rest waits until job n+1 has
    started in the same worker (the last job waits for nothing)."""
    _started.setdefault(n, threading.Event()).set()

    def rest() -> tuple[int, bool]:
        if n == last:
            return n, True
        return n, _started.setdefault(n + 1, threading.Event()).wait(WAIT_S)

    return Finish(rest)


def _fail_in_rest(n: int, user: bool) -> Finish:
    def rest() -> int:
        if n == 2:
            raise UserError("bad input in job 2") if user else OSError("disk full")
        return n

    return Finish(rest)


def test_a_worker_starts_its_next_job_while_the_last_ones_rest_runs():
    jobs = [(f"job {n}", n) for n in range(6)]
    replies = list(run_pool(partial(_job, last=5), jobs, workers=1, window=4, ahead=3))
    assert [label for label, _ in replies] == [label for label, _ in jobs]  # job order kept
    assert [reply for _, reply in replies] == [(n, True) for n in range(6)]  # each rest saw the next job begin


@pytest.mark.parametrize("user, error, words", [
    (False, TokenizeWorkerError, ["job 2", "OSError: disk full"]),
    (True, UserError, ["bad input in job 2"]),
])
def test_a_failing_rest_is_the_jobs_error(user, error, words):
    jobs = [(f"job {n}", n) for n in range(5)]
    with pytest.raises(error) as info:
        list(run_pool(partial(_fail_in_rest, user=user), jobs, workers=2, window=4, ahead=3))
    assert all(w in str(info.value) for w in words)


# --- workers are fresh interpreters of their own -------------------------------------

JOBS_MODULE = '''
import os, sys, time

def modules_seen(marker, job):
    """Whether this worker imported the parent's main module: its marker, and its file."""
    return marker in sys.modules, getattr(sys.modules.get("__mp_main__"), "__file__", None)

def slow_job(out, n):
    open(os.path.join(out, f"started-{n}"), "w").write(str(os.getpid()))
    time.sleep(2)
    return n
'''

MAIN_MODULE = '''
import sys
import xml.dom.minidom  # a heavy import of the parent's main module, as prefect.engine's under Prefect

if __name__ == "__main__":
    from functools import partial
    from gpt2.data.process_pool import run_pool
    from jobs import modules_seen
    for _, seen in run_pool(partial(modules_seen, "xml.dom.minidom"), [("job", 0)], workers=2, window=2):
        print(*seen)
'''


@pytest.mark.parametrize("how", [["-m", "main"], ["main.py"]])
def test_workers_do_not_import_the_parents_main_module(tmp_path, how):
    """multiprocessing's spawn imports the parent's main module in every
    worker; under Prefect that is prefect.engine, ~0.8 s and 44 MB a worker."""
    (tmp_path / "jobs.py").write_text(JOBS_MODULE)
    (tmp_path / "main.py").write_text(MAIN_MODULE)
    out = subprocess.run([sys.executable, *how], cwd=tmp_path, capture_output=True, text=True, timeout=WAIT_S,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "None"]


ORPHAN_PARENT = '''
import os, signal, sys, threading, time
from functools import partial
from gpt2.data.process_pool import run_pool
from jobs import slow_job

out = sys.argv[1]
replies = run_pool(partial(slow_job, out), [(f"job {n}", n) for n in range(4)], workers=1, window=4, ahead=4)
threading.Thread(target=next, args=(replies,), daemon=True).start()
while not os.path.exists(os.path.join(out, "started-0")):
    time.sleep(0.01)
time.sleep(0.2)  # jobs 1-3 reach the worker's queue
os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_worker_whose_parent_was_killed_drops_its_queued_jobs_and_exits(tmp_path):
    (tmp_path / "jobs.py").write_text(JOBS_MODULE)
    (tmp_path / "parent.py").write_text(ORPHAN_PARENT)
    out = tmp_path / "out"
    out.mkdir()
    parent = subprocess.run([sys.executable, "parent.py", str(out)], cwd=tmp_path, timeout=WAIT_S, check=False)
    assert parent.returncode == -signal.SIGKILL
    worker = psutil.Process(int((out / "started-0").read_text()))
    worker.wait(WAIT_S)  # psutil.TimeoutExpired: the orphan lives on
    assert sorted(p.name for p in out.iterdir()) == ["started-0"]  # job 0 finished, jobs 1-3 never began


def _fail_to_start() -> None:
    raise UserError("the tokenizer files are missing")


def test_a_worker_that_cannot_start_raises_its_own_error():
    jobs = [(f"job {n}", n) for n in range(3)]
    with pytest.raises(UserError, match="the tokenizer files are missing"):
        list(run_pool(partial(_fail_in_rest, user=False), jobs, workers=2, window=4, warm_up=_fail_to_start))
