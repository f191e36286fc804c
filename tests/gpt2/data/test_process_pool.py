"""The worker pool's Finish replies: a worker starts its next job while the
last one's rest (a unit's fsyncs, in the data stage) runs, replies still come
back in job order, and a rest that fails is the same error a job's failure
is. Real spawned worker processes."""

from __future__ import annotations

import threading
from functools import partial

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
