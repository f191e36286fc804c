"""HellaSwag scored inside the training loop: the native scorer every
eval.every_steps (and at the last step), items split over ranks. It never
stops training: unloadable items only cost a warning, and a rank that fails
to score still joins the sum (its failure is handed to `on_error`)."""

from __future__ import annotations

import logging
from typing import Callable

import torch

from gpt2.config.tree import Config
from gpt2.eval.hellaswag.items import load_items
from gpt2.eval.hellaswag.scorer import evaluate_hellaswag, prepare
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv, all_reduce, any_rank, autocast

log = logging.getLogger(__name__)
KEYS = ("acc", "acc_norm", "acc_norm_per_token")


class InLoopHellaSwag:
    def __init__(self, cfg: Config, env: DistEnv, amp: torch.dtype | None, micro_batch: int,
                 on_error: Callable[[Exception, str], None]) -> None:
        self.cfg, self.env, self.amp, self.micro_batch, self.on_error = cfg, env, amp, micro_batch, on_error
        self.items = None  # this rank's share, loaded on first use; [] once loading failed

    def due(self, done: int) -> bool:
        every = self.cfg.eval.every_steps
        # The final step too: the finished model's score is the one people compare.
        return bool(every) and (done % every == 0 or done == self.cfg.train.max_steps) and self.items != []

    def __call__(self, model: GPT, done: int) -> dict[str, float] | None:
        """hellaswag/{acc,acc_norm,acc_norm_per_token} over every rank's items
        (every rank calls it), or None when it is not due or cannot run."""
        if not self.due(done) or not self._load():
            return None
        try:
            with autocast(self.env.device, self.amp):
                m = evaluate_hellaswag(model, self.items, self.env.device, self.batch()) if len(self.items) else {}
        except Exception as err:  # noqa: BLE001 - an OOM on this rank: it still joins the sum below
            self.on_error(err, f"scoring HellaSwag at step {done}")
            m = {}
        n = m.get("n", 0)
        counts = all_reduce(torch.tensor([m.get(k, 0.0) * n for k in KEYS] + [n], dtype=torch.float64,
                                         device=self.env.device), self.env, op="sum")
        return {f"hellaswag/{k}": (counts[i] / counts[-1]).item() for i, k in enumerate(KEYS)}

    def _load(self) -> bool:
        if self.items is None:
            try:
                items = load_items(self.cfg.eval.hellaswag_source, self.cfg.eval.limit)
            except Exception as err:  # noqa: BLE001 - optional in-loop metric
                log.warning("in-loop HellaSwag disabled: cannot load %s (%s)", self.cfg.eval.hellaswag_source, err)
                items = []
            if any_rank(not items, self.env):  # all ranks score, or none
                self.items = []
                return False
            # This rank's share, tokenized once for every evaluation of the run.
            self.items = prepare(items).subset(range(self.env.rank, len(items), self.env.world_size))
        return True

    def batch(self) -> int:
        """Items per forward pass: at least eval.batch_size, and as many as the
        training micro-batch's tokens allow: an item packs ~150-250 tokens for
        its four endings, and scoring keeps no activations for a backward pass,
        so half the micro-batch's tokens leave room for float32 log-probabilities."""
        return max(self.cfg.eval.batch_size, self.micro_batch * self.cfg.model.block_size // 512)
