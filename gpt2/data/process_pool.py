"""A pool of worker processes that applies one function to a stream of jobs
and yields the results in input order, for tokenizing (gpt2.data.tokenize_pool)
and for work units (gpt2.data.unit_pool).

Each worker has its own pipes, so the parent always knows which jobs a
worker holds: a worker that dies (killed for memory, crashed) is an error
naming it, its exit signal and its job, raised as soon as the parent
sees the process gone, never a wait for a result that cannot come
(multiprocessing.Pool replaces a dead worker and loses its task). At most
`window` jobs are in flight, so memory is bounded whatever the stream's length.

A job whose end only waits on the disk (fsyncs, a rename, an upload) returns
`Finish(rest)`: its worker runs `rest()` on a second thread and sends what it
returns, and meanwhile starts its next job, so a core never idles while a
unit's bytes reach the disk. Replies still leave each worker in job order.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from gpt2.data.pool_worker import Failure, Finish, command
from gpt2.errors import UserError

__all__ = ["Finish", "TokenizeWorkerError", "default_workers", "run_pool"]

AHEAD_PER_WORKER = 2
"""Batches sent to a worker before its oldest comes back, so it never idles
waiting for the parent between two batches."""

EXIT_WAIT_S = 5.0
"""How long to wait for a worker whose pipe broke to show its exit status."""


class TokenizeWorkerError(UserError, RuntimeError):
    """A tokenizer worker died or failed; the message names it and its documents."""


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def run_pool(fn: Callable, jobs: Iterable[tuple[object, object]], workers: int, window: int,
             warm_up: Callable | None = None, ahead: int = AHEAD_PER_WORKER) -> Iterator[tuple[object, object]]:
    """(label, fn(payload)) for every (label, payload) job, in input order, on
    `workers` processes with at most `window` jobs sent or waiting to be
    yielded. fn must be picklable (a module-level function or a partial of
    one); a label's str names the job in errors. warm_up runs in each worker
    before its first job (loading an encoding, say). ahead: jobs sent to a
    worker before its oldest comes back."""
    pool = _Pool(workers, fn, warm_up, ahead)
    finished = False
    try:
        yield from pool.run(jobs, window)
        finished = True
    finally:
        pool.close(graceful=finished)  # an error or an early stop kills the workers at once


# --- the parent's side ----------------------------------------------------------


@dataclass
class _Worker:
    process: subprocess.Popen
    tasks: Connection
    results: Connection
    held: deque = field(default_factory=deque)
    """(index, label) of jobs sent and not yet answered, oldest (the one being worked on) first."""

    @classmethod
    def start(cls, fn: Callable, warm_up: Callable | None) -> _Worker:
        tasks_out, tasks_in = mp.Pipe(duplex=False)
        results_out, results_in = mp.Pipe(duplex=False)
        # A fresh interpreter, not a fork: the parent may hold threads
        # (datasets, Prefect) that a forked child would inherit in a locked
        # state; and not multiprocessing's spawn, which imports the parent's
        # main module in every worker (gpt2.data.pool_worker says why).
        fds = (tasks_out.fileno(), results_in.fileno())
        process = subprocess.Popen(command(*fds), pass_fds=fds, stdin=subprocess.DEVNULL)
        # Drop our copies of the worker's ends, so its death reads as EOF here.
        tasks_out.close()
        results_in.close()
        worker = cls(process, tasks_in, results_out)
        try:
            tasks_in.send((fn, warm_up))
        except OSError:
            raise worker.died() from None
        return worker

    def exit_code(self, wait_s: float) -> int | None:
        try:
            return self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None

    def died(self) -> UserError:
        try:  # a worker that could not start says why before it exits
            if self.results.poll(0) and isinstance(reply := self.results.recv(), Failure):
                return self.failed(reply)
        except (EOFError, OSError):
            pass
        code, pid = self.exit_code(EXIT_WAIT_S), self.process.pid
        if code is None:
            how = "stopped answering"
        elif code < 0:
            how = f"was killed by {_signal_name(-code)}"
        else:
            how = f"exited with code {code}"
        doing = f"while it held {self.held[0][1]}" if self.held else "while idle"
        return TokenizeWorkerError(
            f"tokenizer worker (pid {pid}) {how} {doing}. A kill (SIGKILL) is most often the system running out of "
            "memory: lower runtime.num_workers or data.max_document_chars, or free memory, then rerun; it resumes "
            "after the last complete part."
        )

    def failed(self, failure: Failure) -> UserError:
        if failure.user_error is not None:  # bad input: the same error as in a single process
            failure.user_error.__cause__ = RuntimeError("traceback in the worker:\n" + failure.traceback)
            return failure.user_error
        job = f"on {self.held[0][1]}" if self.held else "before its first job"
        err = TokenizeWorkerError(f"tokenizer worker (pid {self.process.pid}) failed {job}: {failure.error}")
        err.__cause__ = RuntimeError("traceback in the worker:\n" + failure.traceback)
        return err


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Pool:
    def __init__(self, workers: int, fn: Callable, warm_up: Callable | None = None, ahead: int = AHEAD_PER_WORKER):
        self.ahead = ahead
        self.workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self.workers.append(_Worker.start(fn, warm_up))
        except BaseException:
            self.close(graceful=False)
            raise

    def run(self, jobs: Iterable[tuple[object, object]], window: int) -> Iterator[tuple[object, object]]:
        """Results in input order, with at most `window` jobs sent or waiting to be yielded."""
        jobs = iter(jobs)
        ready: dict[int, tuple[object, object]] = {}
        sent = done = 0
        more = True
        while True:
            while more and sent - done < window and (worker := self._least_busy()) is not None:
                job = next(jobs, None)
                if job is None:
                    more = False
                    break
                self._send(worker, (sent, job[0]), job[1])
                sent += 1
            if done in ready:
                yield ready.pop(done)
                done += 1
            elif not more and done == sent:
                return
            else:
                self._collect(ready)

    def _least_busy(self) -> _Worker | None:
        worker = min(self.workers, key=lambda w: len(w.held))
        return worker if len(worker.held) < self.ahead else None

    def _send(self, worker: _Worker, held: tuple[int, object], payload: object) -> None:
        worker.held.append(held)
        try:
            worker.tasks.send(payload)
        except OSError:  # a broken pipe: the worker is gone
            raise worker.died() from None

    def _collect(self, ready: dict) -> None:
        """Wait for a result or a worker's exit, whichever comes first: a
        worker's death reads as EOF on its results pipe, idle or not."""
        workers = {w.results: w for w in self.workers}
        for obj in wait(list(workers)):
            worker = workers[obj]
            try:
                reply = worker.results.recv()
            except (EOFError, OSError):
                raise worker.died() from None
            if isinstance(reply, Failure):  # its job's, or its start's (then it holds no job)
                raise worker.failed(reply)
            index, label = worker.held.popleft()
            ready[index] = (label, reply)

    def close(self, graceful: bool) -> None:
        for w in self.workers:
            if graceful:
                try:
                    w.tasks.send(None)
                except OSError:
                    pass
        for w in self.workers:
            if not graceful or w.exit_code(EXIT_WAIT_S) is None:
                w.process.terminate()
                if w.exit_code(EXIT_WAIT_S) is None:
                    w.process.kill()
                    w.process.wait()
            w.tasks.close()
            w.results.close()

