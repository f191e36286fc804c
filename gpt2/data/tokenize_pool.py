"""Parallel, order-preserving, bounded-memory tokenization.

The parent streams batches of documents; worker processes encode a whole batch
each and send back one uint16 buffer with `<|endoftext|>` before every
document. Compared with llm.c's `fineweb.py` (one pool task per document and
one numpy conversion per document), batching cuts the pickling and
scheduling cost per document by two orders of magnitude. Processes rather than
threads: tiktoken holds the GIL for part of each call, so threads stop scaling
(measured in bench/tokenize.py). At most `window` batches are in flight, so
memory is bounded whatever the corpus size, and results come back in input
order, so the token stream is the same for any number of workers.

Each worker has its own pipes, so the parent always knows which batches a
worker holds: a worker that dies (killed for memory, crashed) is an error
naming it, its exit signal and its documents, raised as soon as the parent
sees the process gone, never a wait for a result that cannot come
(multiprocessing.Pool replaces a dead worker and loses its task).

Long runs without whitespace (base64 blobs, "aaaa...") are encoded whole:
tiktoken >= 0.13 merges them in near-linear time (0.4 s for a million-letter
run, where 0.12 takes minutes), so cutting them, which would change their
tokens, buys nothing; data.max_document_chars bounds a document's time and
memory instead.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import traceback
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

import numpy as np

from gpt2.errors import UserError
from gpt2.tokenizer import EOT_TOKEN, get_encoding

_ENCODING = None

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


def encode_batch(texts: list[str]) -> np.ndarray:
    """[EOT, doc0..., EOT, doc1..., ...] as uint16 for a batch of documents."""
    global _ENCODING
    if _ENCODING is None:
        _ENCODING = get_encoding("gpt2")
    # encode_to_numpy with no special tokens allowed or disallowed is
    # encode_ordinary without the list round-trip: "<|endoftext|>" inside a
    # document is encoded as plain text, never as the separator.
    pieces = []
    eot = np.array([EOT_TOKEN], dtype=np.uint32)
    for text in texts:
        pieces.append(eot)
        pieces.append(_ENCODING.encode_to_numpy(text, disallowed_special=()))
    if not pieces:
        return np.empty(0, dtype=np.uint16)
    # GPT-2 ids are < 2**16, so the narrowing cast is exact.
    return np.concatenate(pieces).astype(np.uint16)


def _warm_up() -> None:
    encode_batch(["warm up"])


def tokenize_stream(
    batches: Iterable[list[str]], num_workers: int = 0, window: int | None = None, first_document: int = 0
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (documents in batch, tokens) for every batch, in input order.

    num_workers=0 uses every core; 1 encodes in this process. first_document:
    the index of the first document in the source, to name documents in errors.
    """
    workers = num_workers or default_workers()
    if workers == 1:
        for texts in batches:
            yield len(texts), encode_batch(texts)
        return
    pool = _Pool(workers)
    finished = False
    try:
        yield from pool.run(batches, window or 4 * workers, first_document)
        finished = True
    finally:
        pool.close(graceful=finished)  # an error or an early stop kills the workers at once


# --- the workers --------------------------------------------------------------


@dataclass(frozen=True)
class _Failure:
    """What a worker sends back instead of tokens when encoding raised."""

    error: str
    traceback: str


def _serve(tasks: Connection, results: Connection) -> None:
    """A worker: encode the batches it is sent, in order, until None or the parent goes."""
    # Ctrl-C reaches the whole process group: the parent decides, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _warm_up()
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(tasks, inbox), daemon=True).start()
    while (texts := inbox.get()) is not None:
        try:
            reply = encode_batch(texts)
        except BaseException as err:  # noqa: BLE001 - tiktoken's PanicException is not an Exception
            reply = _Failure(f"{type(err).__name__}: {err}", traceback.format_exc())
        try:
            results.send(reply)
        except OSError:  # the parent is gone
            return


def _receive(tasks: Connection, inbox: queue.SimpleQueue) -> None:
    # Read batches as they come, even while one is encoded: otherwise the
    # parent, blocked sending us a batch, and we, blocked sending it a result,
    # would wait on each other.
    try:
        while (texts := tasks.recv()) is not None:
            inbox.put(texts)
    except (EOFError, OSError):  # the parent is gone
        pass
    inbox.put(None)


# --- the parent's side ----------------------------------------------------------


@dataclass(frozen=True)
class _Batch:
    index: int
    first_document: int
    documents: int

    def __str__(self) -> str:
        last = self.first_document + self.documents - 1
        return f"documents {self.first_document}-{last} (batch {self.index})"


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    tasks: Connection
    results: Connection
    held: deque = field(default_factory=deque)
    """Batches sent and not yet answered, oldest (the one being encoded) first."""

    @classmethod
    def start(cls, ctx) -> _Worker:
        tasks_out, tasks_in = ctx.Pipe(duplex=False)
        results_out, results_in = ctx.Pipe(duplex=False)
        # spawn, not fork: the parent may hold threads (datasets, Prefect) that
        # a forked child would inherit in a locked state.
        process = ctx.Process(target=_serve, args=(tasks_out, results_in), name="tokenize-worker", daemon=True)
        process.start()
        # Drop our copies of the worker's ends, so its death reads as EOF here.
        tasks_out.close()
        results_in.close()
        return cls(process, tasks_in, results_out)

    def died(self) -> TokenizeWorkerError:
        self.process.join(EXIT_WAIT_S)
        code, pid = self.process.exitcode, self.process.pid
        if code is None:
            how = "stopped answering"
        elif code < 0:
            how = f"was killed by {_signal_name(-code)}"
        else:
            how = f"exited with code {code}"
        doing = f"while it held {self.held[0]}" if self.held else "while idle"
        return TokenizeWorkerError(
            f"tokenizer worker (pid {pid}) {how} {doing}. A kill (SIGKILL) is most often the system running out of "
            "memory: lower runtime.num_workers or data.max_document_chars, or free memory, then rerun; it resumes "
            "after the last complete part."
        )

    def failed(self, failure: _Failure) -> TokenizeWorkerError:
        err = TokenizeWorkerError(f"tokenizer worker (pid {self.process.pid}) failed on {self.held[0]}: {failure.error}")
        err.__cause__ = RuntimeError("traceback in the worker:\n" + failure.traceback)
        return err


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Pool:
    def __init__(self, workers: int):
        ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self.workers.append(_Worker.start(ctx))
        except BaseException:
            self.close(graceful=False)
            raise

    def run(self, batches: Iterable[list[str]], window: int, first_document: int) -> Iterator[tuple[int, np.ndarray]]:
        """Results in input order, with at most `window` batches sent or waiting to be yielded."""
        batches = iter(batches)
        ready: dict[int, tuple[int, np.ndarray]] = {}
        sent = done = 0
        more = True
        while True:
            while more and sent - done < window and (worker := self._least_busy()) is not None:
                texts = next(batches, None)
                if texts is None:
                    more = False
                    break
                self._send(worker, _Batch(sent, first_document, len(texts)), texts)
                sent, first_document = sent + 1, first_document + len(texts)
            if done in ready:
                yield ready.pop(done)
                done += 1
            elif not more and done == sent:
                return
            else:
                self._collect(ready)

    def _least_busy(self) -> _Worker | None:
        worker = min(self.workers, key=lambda w: len(w.held))
        return worker if len(worker.held) < AHEAD_PER_WORKER else None

    def _send(self, worker: _Worker, batch: _Batch, texts: list[str]) -> None:
        worker.held.append(batch)
        try:
            worker.tasks.send(texts)
        except OSError:  # a broken pipe: the worker is gone
            raise worker.died() from None

    def _collect(self, ready: dict) -> None:
        """Wait for a result or a worker's exit, whichever comes first."""
        answering = {w.results: w for w in self.workers if w.held}
        exiting = {w.process.sentinel: w for w in self.workers}
        for obj in wait([*answering, *exiting]):
            if obj in answering:
                worker = answering[obj]
                try:
                    reply = worker.results.recv()
                except (EOFError, OSError):
                    raise worker.died() from None
                if isinstance(reply, _Failure):
                    raise worker.failed(reply)
                batch = worker.held.popleft()
                ready[batch.index] = (batch.documents, reply)
            elif not exiting[obj].held:  # gone while holding a batch: its pipe's EOF says so, above
                raise exiting[obj].died()

    def close(self, graceful: bool) -> None:
        for w in self.workers:
            if graceful:
                try:
                    w.tasks.send(None)
                except OSError:
                    pass
        for w in self.workers:
            if graceful:
                w.process.join(EXIT_WAIT_S)
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(EXIT_WAIT_S)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.tasks.close()
            w.results.close()
