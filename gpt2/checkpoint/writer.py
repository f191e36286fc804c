"""Checkpoints written in the background, so the accelerator keeps training.

The training thread only copies weights and optimizer state to the CPU (a
fraction of a step); serializing, hashing, writing and pruning happen on one
writer thread. One write is in flight at a time: the next save, the end of
the run, SIGTERM and errors all wait for it, so the last good checkpoint is
always complete before the process exits.

With a staging directory every save goes to local disk first and to the root
after (gpt2.checkpoint.staging), and is timed: `perf/checkpoint_s` (the whole
save) and `perf/checkpoint_local_s` (the local write), with a warning when a
save outlasts the window a preempted trainer gets before SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from gpt2 import layout, storage
from gpt2.checkpoint import store
from gpt2.train.preemption import kill_window, window_warning
from gpt2.train.throughput import now

log = logging.getLogger(__name__)

KILL_AFTER_LOCAL_WRITE_ENV = "GPT2_TEST_KILL_AFTER_LOCAL_WRITE"
"""Tests only: SIGKILL the trainer right after a checkpoint's local write, as a
preemption's SIGKILL arriving during the upload would."""


class CheckpointWriter:
    def __init__(self, run_dir: str, keep: int, last_url: str | None = None, fence=None,
                 staging: str | None = None, metrics: Callable[[dict, int], None] | None = None,
                 window: tuple[float, str] | None = None):
        """`fence`: called before anything is committed or pruned (the run's
        lease check); `staging`: a local run directory written before the
        root; `metrics(values, step)` receives each save's timings; `window`:
        the kill window saves are checked against (default: this process's,
        gpt2.train.preemption.kill_window)."""
        self.run_dir, self.keep, self.last_url, self.fence = run_dir, keep, last_url, fence
        distributed = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        self.staging, self.metrics, self.window = staging, metrics, window or kill_window(distributed)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: tuple[Future, str] | None = None

    def submit(self, url: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               state: dict, rng: dict) -> float:
        """Snapshot now, write later; returns the seconds the caller was held."""
        t0 = now()
        self.wait()
        tensors, opt_state = store.snapshot(model, optimizer)
        self._pending = (self._pool.submit(self._write, url, tensors, opt_state, state, rng), url)
        return now() - t0

    def _write(self, url: str, tensors: dict, opt_state: dict, state: dict, rng: dict) -> None:
        t0, step = now(), state["step"]
        blobs = store.encode_checkpoint(tensors, opt_state, state, rng)
        local = layout.checkpoint_dir(self.staging, step) if self.staging else None
        if local is not None:
            store.write_files(local, blobs, step)  # fsynced: it survives the process
            if os.environ.get(KILL_AFTER_LOCAL_WRITE_ENV):
                os.kill(os.getpid(), signal.SIGKILL)
        local_s = now() - t0
        store.write_files(url, blobs, step, fence=self.fence)
        if local is not None:
            storage.remove(local, recursive=True)  # in the root now
        if self.fence is not None:
            self.fence()
        store.prune(self.run_dir, self.keep, written_step=step)
        self._report(url, step, now() - t0, local_s)

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
