"""What the in-loop scorers share: when one is due (every N steps and at the last step), its
items read once and split over the ranks (all ranks score, or none: a rank without items would
leave the others waiting in the sum), and its log line."""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from gpt2.config.tree import Config
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv, any_rank

log = logging.getLogger(__name__)


class InLoopScorer:
    what = ""
    """The metric's name in the log ("HellaSwag", "CORE")."""

    def __init__(self, cfg: Config, env: DistEnv, amp: torch.dtype | None,
                 on_error: Callable[[Exception, str], None]) -> None:
        self.cfg, self.env, self.amp, self.on_error = cfg, env, amp, on_error
        self.share: Any = None  # this rank's items, read on first use; [] once reading failed on any rank

    def every(self) -> int:
        raise NotImplementedError

    def source(self) -> str:
        """What `read_share` reads, for the warning when it cannot."""
        raise NotImplementedError

    def read_share(self) -> Any:
        """This rank's items, tokenized once for every evaluation of the run; None when there are none."""
        raise NotImplementedError

    def score(self, model: GPT, done: int) -> dict[str, float] | None:
        """The metrics over every rank's items (every rank calls it)."""
        raise NotImplementedError

    def describe(self, metrics: dict[str, float], done: int) -> str:
        return f"{self.what} at step {done}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())

    def due(self, done: int) -> bool:
        every = self.every()
        # The final step too: the finished model's score is the one people compare.
        return bool(every) and (done % every == 0 or done == self.cfg.train.max_steps) and self.share != []

    def __call__(self, model: GPT, done: int) -> dict[str, float] | None:
        """The metrics, or None when not due or it cannot run."""
        if not self.due(done) or not self._load():
            return None
        return self.score(model, done)

    def _load(self) -> bool:
        if self.share is None:
            try:
                mine = self.read_share()
            except Exception as err:  # noqa: BLE001 - an optional in-loop metric never stops training
                log.warning("in-loop %s disabled: cannot read %s (%s)", self.what, self.source(), err)
                mine = None
            if any_rank(mine is None, self.env):  # all ranks score, or none
                self.share = []
                return False
            self.share = mine
        return True
