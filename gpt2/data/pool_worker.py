"""The worker side of gpt2.data.process_pool: a process that applies one
function to the jobs it is sent, in order, and sends back each result.

A worker is started as its own command (`command()`), not by
multiprocessing's spawn, because spawn re-imports the parent's main module
in every child so that functions defined there unpickle. Under Prefect that
module is `prefect.engine` (the process worker runs flow runs as
`python -m prefect.engine`): every tokenize worker imported all of Prefect,
~0.8 s of CPU and 44 MB of memory each before its first job (126 MB
against 82 MB resident), measured. Our jobs are
always module-level functions, so a worker only needs the parent's sys.path,
which it takes on its command line, as spawn would have given it.

    python -c '<command()[2]>' TASKS_FD RESULTS_FD SYS_PATH...

The first message on the tasks pipe is (fn, warm_up); then jobs, then None.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from gpt2.errors import UserError

_PROGRAM = ("import sys; sys.path[:] = sys.argv[3:]; "
            "from gpt2.data.pool_worker import main; main(int(sys.argv[1]), int(sys.argv[2]))")


def command(tasks_fd: int, results_fd: int) -> list[str]:
    """The command line of a worker reading jobs from tasks_fd and answering on results_fd."""
    return [sys.executable, "-c", _PROGRAM, str(tasks_fd), str(results_fd), *sys.path]


@dataclass(frozen=True)
class Finish:
    """A reply whose rest only waits on I/O: the worker calls `rest()` on its
    sending thread and sends what it returns (or the failure it raises)."""

    rest: Callable[[], object]


@dataclass(frozen=True)
class Failure:
    """What a worker sends back instead of a result when its job raised."""

    error: str
    traceback: str
    user_error: UserError | None = None
    """Bad input (a UserError), raised as itself in the parent."""


def main(tasks_fd: int, results_fd: int) -> None:
    tasks, results = Connection(tasks_fd, writable=False), Connection(results_fd, readable=False)
    # Ctrl-C reaches the whole process group: the parent decides, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fn, warm_up = tasks.recv()
        if warm_up is not None:
            warm_up()
    except EOFError:  # the parent went before sending anything
        return
    except BaseException as err:  # noqa: BLE001 - sent to the parent, which raises it
        results.send(_failure(err))  # a reply with no job: the parent reports a worker that could not start
        return
    serve(tasks, results, fn)


def serve(tasks: Connection, results: Connection, fn: Callable) -> None:
    """Apply fn to the jobs on `tasks`, in order, until None or the parent goes."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    orphaned = threading.Event()
    threading.Thread(target=_receive, args=(tasks, inbox, orphaned), daemon=True).start()
    sender = threading.Thread(target=_send_replies, args=(results, outbox), daemon=True)
    sender.start()
    # Once the parent is gone, jobs still queued here are dropped: nobody takes their results.
    while (job := inbox.get()) is not None and not orphaned.is_set():
        outbox.put(_attempt(fn, job))
    outbox.put(None)
    sender.join()  # the last replies' rest (a unit's fsyncs) is done before the worker exits


def _attempt(fn: Callable, *args) -> object:
    try:
        return fn(*args)
    except BaseException as err:  # noqa: BLE001 - tiktoken's PanicException is not an Exception
        return _failure(err)


def _failure(err: BaseException) -> Failure:
    user = err if isinstance(err, UserError) else None
    return Failure(f"{type(err).__name__}: {err}", traceback.format_exc(), user)


def _send_replies(results: Connection, outbox: queue.SimpleQueue) -> None:
    """Send replies in job order, first finishing those that return Finish."""
    while (reply := outbox.get()) is not None:
        if isinstance(reply, Finish):
            reply = _attempt(reply.rest)
        try:
            results.send(reply)
        except OSError:  # the parent is gone
            return


def _receive(tasks: Connection, inbox: queue.SimpleQueue, orphaned: threading.Event) -> None:
    # Read jobs as they come, even while one runs: otherwise the parent,
    # blocked sending us a job, and we, blocked sending it a result, would
    # wait on each other.
    try:
        while (job := tasks.recv()) is not None:
            inbox.put(job)
    except (EOFError, OSError):  # the parent is gone
        orphaned.set()
    inbox.put(None)
