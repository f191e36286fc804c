"""A failure inside a step's collectives, told to every rank at once through
the c10d store.

The step's flag all-reduce (gpt2.train.loop) carries a failure a rank lives
through to the next step. A failure inside the step itself cannot wait for
it: when one rank's forward or backward raises (an OOM) or its validation
pass does, the others are already waiting for it in DDP's gradient
all-reduce or in validation's. NCCL would hold them there until
runtime.collective_timeout_s; gloo fails them once the failing rank tears its
group down, with "Connection closed by peer", which says nothing of the cause.

So the failing rank posts its message to the store every rank already shares
(the default group's: the one torchrun serves), and every rank runs a watcher
thread that polls it every POLL_S seconds. Seeing another rank's failure, the
watcher records it and, on NCCL, aborts the default process group, so the
collective the rank waits in returns at once (gloo's returns when the failing
rank tears its group down, which it does right after). The rank then ends
with a TrainingError naming the failing rank and its message. The steps pay
nothing for this: only the watcher talks to the store.

The store may live in the failing rank's process (rank 0 when the group was
started without torchrun), so a rank that posted waits, up to ACK_WAIT_S,
for every other rank to have read its message before it tears down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import torch.distributed as dist

from gpt2.process.distributed import DistEnv
from gpt2.train.session import TrainingError

log = logging.getLogger(__name__)

POLL_S = 1.0
"""How often the watcher asks the store: one small request per rank, off the
training thread."""

ACK_WAIT_S = 30.0
"""How long a rank that posted a failure waits for the others to read it
(a dead peer never does)."""


def collective_abort(group: dist.ProcessGroup, backend: str) -> Callable[[], None] | None:
    """What unblocks a collective this rank waits in for a failed peer: NCCL's
    abort of the group (`ProcessGroup.abort`, in every torch pyproject allows,
    2.11-2.13; run on NCCL with torch 2.11 on an H100). Only NCCL needs it: a
    gloo collective fails by itself once the peer tears down."""
    return group.abort if backend == "nccl" else None


class FailureBoard:
    """This run's failure board; `start` it once the process group is up."""

    def __init__(self, store: dist.Store | None, rank: int, world_size: int,
                 abort: Callable[[], None] | None = None, poll_s: float = POLL_S):
        """`store`: shared by all ranks (None: one process, nothing to tell);
        `abort`: unblocks this rank's waiting collective (NCCL's abort)."""
        # torchrun's store outlives a restart of the workers: each round its own key.
        round_ = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.key, self.seen_key = f"gpt2/failure/{round_}", f"gpt2/failure/{round_}/seen"
        self.store, self.rank, self.world, self.abort, self.poll_s = store, rank, world_size, abort, poll_s
        self.seen: tuple[int, str] | None = None
        """The failure posted first (rank, message), once this rank knows of it."""
        self.posted = False
        self._lock = threading.Lock()  # the watcher and the training thread both look
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="failure-board", daemon=True)

    @classmethod
    def for_group(cls, env: DistEnv) -> FailureBoard:
        """The board of the default process group (an idle one for one process)."""
        if not env.is_distributed:
            return cls(None, env.rank, 1)
        abort = collective_abort(dist.group.WORLD, dist.get_backend())
        # The store init_process_group rendezvoused on (torch has no public accessor for it).
        return cls(dist.distributed_c10d._get_default_store(), env.rank, env.world_size, abort)

    def start(self) -> FailureBoard:
        if self.store is not None:
            self._watcher.start()
        return self

    def post(self, err: BaseException) -> None:
        """Tell every rank that this one failed with `err` (the first post stands)."""
        if self.store is None:
            return
        message = f"{self.rank}\n{type(err).__name__}: {err}"
        try:
            self.posted = self.store.compare_set(self.key, "", message).decode() == message
        except Exception as store_err:  # noqa: BLE001 - the error itself still ends this rank
            log.warning("rank %d could not post its failure to the other ranks (%s)", self.rank, store_err)

    def peer_failure(self) -> tuple[int, str] | None:
        """Another rank's posted failure, if one is known (asks the store when
        the watcher has not seen one yet)."""
        if self.seen is None and self.store is not None:
            self._look()
        return self.seen if self.seen is not None and self.seen[0] != self.rank else None

    def check(self, done: int) -> None:
        """Raise another rank's failure if the watcher has seen one (no store request)."""
        if self.seen is not None and self.seen[0] != self.rank:
            raise self._error(self.seen, done)

    @contextlib.contextmanager
    def watching(self, agreed: Callable[[BaseException], bool], done: Callable[[], int]) -> Iterator[None]:
        """Around the training loop: an error leaving it is either another
        rank's failure reaching this one (raised as a TrainingError naming that
        rank and its message), one every rank raises alike (`agreed`: after a
        flag all-reduce), or this rank's own, posted for the others."""
        try:
            yield
        except Exception as err:
            peer = self.peer_failure()
            if peer is not None:
                raise self._error(peer, done()) from err
            if not agreed(err):
                self.post(err)
            raise

    def close(self) -> None:
        """Stop watching; if this rank posted, first wait (bounded) for the
        others to have read it; otherwise tell a rank that posted that its
        message arrived."""
        self._stop.set()
        if self.store is None:
            return
        if self._watcher.is_alive():
            self._watcher.join()
        try:
            if self.posted:
                self._await_readers()
            elif self.seen is None:
                self._look(unblock=False)  # this rank is done: acknowledge only
        except Exception as err:  # noqa: BLE001 - the store went with a finished peer: nothing left to tell
            log.debug("failure board closed without the store (%s)", err)

    def _error(self, failure: tuple[int, str], done: int) -> TrainingError:
        rank, message = failure
        return TrainingError(f"rank {rank} failed: {message}; rank {self.rank} stopped after step {done} instead "
                             "of waiting for it in a collective")

    def _look(self, unblock: bool = True) -> None:
        """Read a posted failure into `seen`; acknowledge another rank's, and
        unblock this rank's collective (NCCL)."""
        with self._lock:
            if self.seen is None:
                self._read(unblock)

    def _read(self, unblock: bool) -> None:
        try:
            if not self.store.check([self.key]):
                return
            rank, message = self.store.get(self.key).decode().split("\n", 1)
        except Exception:  # noqa: BLE001 - the store is gone: the job is ending anyway
            return
        self.seen = (int(rank), message)
        if self.seen[0] == self.rank:
            return
        with contextlib.suppress(Exception):
            self.store.add(self.seen_key, 1)
        if unblock and self.abort is not None:
            log.error("rank %d failed (%s): aborting rank %d's collectives", self.seen[0], message, self.rank)
            self.abort()

    def _watch(self) -> None:
        while self.seen is None and not self._stop.wait(self.poll_s):
            self._look()

    def _await_readers(self) -> None:
        deadline = time.monotonic() + ACK_WAIT_S
        while self.store.add(self.seen_key, 0) < self.world - 1 and time.monotonic() < deadline:
            time.sleep(self.poll_s / 10)
