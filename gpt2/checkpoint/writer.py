"""Checkpoints written in the background, so the accelerator keeps training.

The training thread only copies weights and optimizer state to the CPU (a
fraction of a step); serializing, hashing, uploading and pruning happen on one
writer thread. One write is in flight at a time: the next save, the end of
the run, SIGTERM and errors all wait for it, so the last good checkpoint is
always complete before the process exits.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from gpt2.checkpoint import store
from gpt2.train.throughput import now

log = logging.getLogger(__name__)


class CheckpointWriter:
    def __init__(self, run_dir: str, keep: int, last_url: str | None = None, fence=None):
        """`fence`: called before anything is committed or pruned (the run's lease check)."""
        self.run_dir, self.keep, self.last_url, self.fence = run_dir, keep, last_url, fence
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
        t0 = now()
        store.write_checkpoint(url, tensors, opt_state, state, rng, fence=self.fence)
        if self.fence is not None:
            self.fence()
        store.prune(self.run_dir, self.keep, written_step=state["step"])
        log.info("checkpoint %s written in %.2fs", url, now() - t0)

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
