"""Checkpoints written in the background, so the accelerator keeps training.

The training thread only copies weights and optimizer state to the CPU (a
fraction of a step); serializing, hashing, writing and pruning happen on one
writer thread. One write is in flight at a time: the next save, the end of
the run, SIGTERM and errors all wait for it, so the last good checkpoint is
always complete before the process exits.

On several ranks every rank has a writer and writes its own share of the
optimizer state (gpt2.checkpoint.shares) at the same time as the others;
rank 0 also writes the weights, RNG and state, and commits the checkpoint
(its COMPLETE marker, with every rank's sizes and sha256) once all ranks
report their files written. The ranks' writers agree after each phase over a
gloo group of their own (small records, never tensors), so a failure on any
rank fails the save on every rank instead of leaving one waiting; and no rank
ever holds the whole optimizer state, so a save costs the same on 8 ranks as
on 1 (bench/checkpoint_save.py).

With a staging directory every save goes to local disk first and to the root
after (gpt2.checkpoint.staging), and is timed: `perf/checkpoint_s` (the whole
save) and `perf/checkpoint_local_s` (the local write), with a warning when a
save outlasts the window a preempted trainer gets before SIGKILL. The local
copy is complete when all ranks share rank 0's disk (one machine); with
ranks on several machines each keeps only its own files there, and the
parallel upload is what keeps the save inside the window.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from time import perf_counter as now
from typing import Callable

import torch
import torch.distributed as dist

from gpt2.checkpoint import shares, store
from gpt2.checkpoint.optim_share import state_share
from gpt2.process.kill_window import kill_window, window_warning
from gpt2.root import layout, storage

log = logging.getLogger(__name__)

KILL_AFTER_LOCAL_WRITE_ENV = "GPT2_TEST_KILL_AFTER_LOCAL_WRITE"
"""Tests only: SIGKILL the trainer right after a checkpoint's local write, as a
preemption's SIGKILL arriving during the upload would."""

AGREE_TIMEOUT = datetime.timedelta(hours=1)
"""How long a writer waits for the other ranks' writers: as long as the
slowest rank's upload of its share may take (a dead peer is noticed at once)."""


class CheckpointWriter:
    def __init__(self, run_dir: str, keep: int, last_url: str | None = None, fence=None,
                 staging: str | None = None, metrics: Callable[[dict, int], None] | None = None,
                 window: tuple[float, str] | None = None):
        """`fence`: called before anything is committed or pruned (the run's
        lease check, on rank 0); `staging`: a local run directory written
        before the root; `metrics(values, step)` receives each save's
        timings; `window`: the kill window saves are checked against
        (default: this process's, gpt2.process.kill_window.kill_window). Under a
        process group every rank constructs one (a collective)."""
        self.run_dir, self.keep, self.last_url, self.fence = run_dir, keep, last_url, fence
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        # The writers' own group: their records never interleave with the training collectives.
        self.group = dist.new_group(backend="gloo", timeout=AGREE_TIMEOUT) if distributed else None
        self.staging, self.metrics, self.window = staging, metrics, window or kill_window(distributed)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: tuple[Future, str] | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def submit(self, url: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               state: dict, rng: dict) -> float:
        """Snapshot now, write later; returns the seconds the caller was held.
        Every rank calls it at the same step; only rank 0's `state`, `rng`
        and weights are written."""
        t0 = now()
        self.wait()
        share = store.host_copy(state_share(optimizer, self.rank, self.world))
        tensors = store.model_tensors(model) if self.is_main else None
        self._pending = (self._pool.submit(self._write, url, tensors, share, state, rng), url)
        return now() - t0

    def _blobs(self, tensors: dict | None, share: dict, state: dict, rng: dict) -> dict[str, bytes]:
        """This rank's files: its optimizer share, and on rank 0 the rest."""
        mine = {shares.share_name(self.rank, self.world): store.encode_optimizer(share)}
        return {**store.encode_required(tensors, state, rng), **mine} if self.is_main else mine

    def _write(self, url: str, tensors: dict | None, share: dict, state: dict, rng: dict) -> None:
        t0, step = now(), state["step"]
        blobs = self._blobs(tensors, share, state, rng)
        local = layout.checkpoint_dir(self.staging, step) if self.staging else None
        self._agree(url, lambda: self._clear(url, local))
        if local is not None:
            files = self._agree(url, lambda: store.write_blobs(local, blobs))  # fsynced: it survives the process
            if self.is_main and self._all_here(local, files):
                store.write_marker(local, step, files)
            if self.is_main and os.environ.get(KILL_AFTER_LOCAL_WRITE_ENV):
                os.kill(os.getpid(), signal.SIGKILL)
        local_s = now() - t0
        files = self._agree(url, lambda: store.write_blobs(url, blobs))
        self._agree(url, lambda: self._commit(url, step, files) if self.is_main else self._drop(local, blobs))
        self._agree(url, lambda: self._tidy(local, step) if self.is_main else None)
        if self.is_main:
            self._report(url, step, now() - t0, local_s)

    def _agree(self, url: str, work: Callable[[], dict | None]) -> dict:
        """Run this rank's part of a phase, then learn every rank's outcome:
        the files they wrote (merged), or the first error, raised on every
        rank (as itself where it happened, so LeaseLost stays LeaseLost)."""
        error, result = None, None
        try:
            result = work()
        except Exception as err:  # noqa: BLE001 - every rank must hear of it
            error = err
        if self.group is None:
            if error is not None:
                raise error
            return result or {}
        records: list = [None] * self.world
        dist.all_gather_object(records, (result, f"{type(error).__name__}: {error}" if error else None),
                               group=self.group)
        if error is not None:
            raise error
        failed = [(rank, msg) for rank, (_, msg) in enumerate(records) if msg]
        if failed:
            rank, msg = failed[0]
            raise store.CheckpointError(f"checkpoint {url} failed on rank {rank}: {msg}")
        return {name: entry for files, _ in records for name, entry in (files or {}).items()}

    def _clear(self, url: str, local: str | None) -> None:
        """Rank 0, before any rank writes: leftovers of a killed write at this step go."""
        if not self.is_main:
            return
        if self.fence is not None:
            self.fence()
        for target in (url, local):
            if target is not None:
                storage.remove(storage.join(target, store.MARKER))
                storage.remove(target, recursive=True)

    @staticmethod
    def _all_here(local: str, files: dict[str, dict]) -> bool:
        """Every rank's file is on this disk (all ranks on rank 0's machine)."""
        return all(storage.size(storage.join(local, name)) == entry["bytes"] for name, entry in files.items())

    def _commit(self, url: str, step: int, files: dict[str, dict]) -> None:
        if self.fence is not None:
            self.fence()
        store.write_marker(url, step, files)

    def _drop(self, local: str | None, blobs: dict[str, bytes]) -> None:
        """Another rank's local copies, once the root has them."""
        for name in blobs if local is not None else ():
            storage.remove(storage.join(local, name))

    def _tidy(self, local: str | None, step: int) -> None:
        if local is not None:
            storage.remove(local, recursive=True)  # in the root now
        if self.fence is not None:
            self.fence()
        store.prune(self.run_dir, self.keep, written_step=step)

    def _report(self, url: str, step: int, seconds: float, local_s: float) -> None:
        log.info("checkpoint %s written in %.2fs%s", url, seconds,
                 f" (local copy first: {local_s:.2f}s)" if self.staging else "")
        if self.metrics is not None:
            values = {"perf/checkpoint_s": seconds}
            if self.staging:
                values["perf/checkpoint_local_s"] = local_s
            self.metrics(values, step)
        warning = window_warning(step, seconds, local_s, self.window)
        if warning:
            log.warning("%s", warning)

    def failed(self) -> bool:
        """The write in flight has failed (never blocks; `wait` raises its error).
        The training loop asks every step, so the failure stops every rank at the
        next step's flag all-reduce rather than at this rank's next save."""
        pending = self._pending
        return pending is not None and pending[0].done() and pending[0].exception() is not None

    def wait(self) -> str | None:
        """Block until the write in flight is complete (re-raising its error);
        returns the URL of the newest checkpoint known to be complete."""
        if self._pending is not None:
            (future, url), self._pending = self._pending, None
            future.result()
            self.last_url = url
        return self.last_url

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
