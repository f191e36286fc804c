"""HellaSwag scored inside the training loop: the native scorer every
eval.every_steps (and at the last step), items split over ranks. It never
stops training: unloadable items only cost a warning, and a rank that fails
to score still joins the sum (its failure is handed to `on_error`)."""

from __future__ import annotations

from typing import Callable

import torch

from gpt2.config.tree import Config
from gpt2.eval.hellaswag.items import load_items
from gpt2.eval.hellaswag.scorer import evaluate_hellaswag, prepare
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv, all_reduce, autocast
from gpt2.train.in_loop.scorer import InLoopScorer

KEYS = ("acc", "acc_norm", "acc_norm_per_token")


class InLoopHellaSwag(InLoopScorer):
    what = "HellaSwag"

    def __init__(self, cfg: Config, env: DistEnv, amp: torch.dtype | None, micro_batch: int,
                 on_error: Callable[[Exception, str], None]) -> None:
        super().__init__(cfg, env, amp, on_error)
        self.micro_batch = micro_batch

    def every(self) -> int:
        return self.cfg.eval.every_steps

    def source(self) -> str:
        return self.cfg.eval.hellaswag_source

    def read_share(self):
        items = load_items(self.cfg.eval.hellaswag_source, self.cfg.eval.limit)
        if not items:
            return None
        return prepare(items).subset(range(self.env.rank, len(items), self.env.world_size))

    def score(self, model: GPT, done: int) -> dict[str, float]:
        """hellaswag/{acc,acc_norm,acc_norm_per_token} over every rank's items."""
        try:
            with autocast(self.env.device, self.amp):
                m = evaluate_hellaswag(model, self.share, self.env.device, self.batch()) if len(self.share) else {}
        except Exception as err:  # noqa: BLE001 - an OOM on this rank: it still joins the sum below
            self.on_error(err, f"scoring HellaSwag at step {done}")
            m = {}
        n = m.get("n", 0)
        counts = all_reduce(torch.tensor([m.get(k, 0.0) * n for k in KEYS] + [n], dtype=torch.float64,
                                         device=self.env.device), self.env, op="sum")
        return {f"hellaswag/{k}": (counts[i] / counts[-1]).item() for i, k in enumerate(KEYS)}

    def batch(self) -> int:
        """Items per forward pass: at least eval.batch_size, and as many as the
        training micro-batch's tokens allow: an item packs ~150-250 tokens for
        its four endings, and scoring keeps no activations for a backward pass,
        so half the micro-batch's tokens leave room for float32 log-probabilities."""
        return max(self.cfg.eval.batch_size, self.micro_batch * self.cfg.model.block_size // 512)
