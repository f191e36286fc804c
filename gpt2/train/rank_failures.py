"""Failures one rank lives through, agreed on by every rank.

A failure one rank survives (its rank-0-only reporting, a checkpoint write, a
shard fetch, an in-loop evaluation) must not end that rank at once: the
others would block in their next collective until its timeout. It is kept
here, rides on the next step's flag all-reduce as the third flag, every rank
stops after that step, and each ends with the failing rank's message. (A
failure inside a step's collectives cannot wait for that: the failure board,
gpt2.train.failure_board, tells the others through the c10d store.)
"""

from __future__ import annotations

import logging

import torch

from gpt2.checkpoint.writer import CheckpointWriter
from gpt2.process.distributed import DistEnv, control_group
from gpt2.train.session import TrainingError

log = logging.getLogger(__name__)


class RankFailures:
    def __init__(self, env: DistEnv, writer: CheckpointWriter | None) -> None:
        self.env, self.writer = env, writer
        self.failure: Exception | None = None  # this rank's, until the next flag all-reduce carries it
        self.agreed: BaseException | None = None  # raised on every rank alike: not news for the board

    def failed(self) -> bool:
        """This rank's failure flag: a failure kept, or a background checkpoint write that failed."""
        return self.failure is not None or (self.writer is not None and self.writer.failed())

    def survive(self, err: Exception, what: str) -> None:
        """A failure this rank lives through: alone it ends the run at once;
        with peers it is kept for the next step's flag all-reduce (the first
        one counts), so every rank stops together instead of waiting on this
        one in a collective."""
        if not self.env.is_distributed:
            raise err
        log.error("rank %d: %s failed (%s: %s); every rank stops after the next step", self.env.rank, what,
                  type(err).__name__, err, exc_info=err)
        self.failure = self.failure or err

    def raise_agreed(self, done: int) -> None:
        """Every rank: raise the failure some rank reported, with its message."""
        if self.failure is None and self.writer is not None and self.writer.failed():
            try:
                self.writer.wait()
            except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
                self.failure = err
        mine = f"{type(self.failure).__name__}: {self.failure}" if self.failure is not None else None
        messages = [mine]
        if self.env.is_distributed:
            messages = [None] * self.env.world_size
            torch.distributed.all_gather_object(messages, mine, group=control_group())
        rank, message = next((r, m) for r, m in enumerate(messages) if m is not None)
        if rank == self.env.rank:
            raise self.agree(self.failure)  # as it was raised: a LeaseLost stays one
        raise self.agree(TrainingError(f"rank {rank} failed: {message}; every rank stopped after step {done}"))

    def agree(self, err: BaseException) -> BaseException:
        """`err`, raised on every rank after a flag all-reduce (not posted to the board)."""
        self.agreed = err
        return err
