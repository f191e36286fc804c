"""What the training loop scores between steps, on every rank, each at its own interval (and at
the last step): HellaSwag's native scorer (`hellaswag`, eval.every_steps) and a subsampled CORE
(`core`, eval.core_every). Rank 0 logs the sums to the training run at the step.

    for scorer in scorers(cfg, env, amp, micro_batch, on_error):
        metrics = scorer(model, done)  # on every rank; rank 0 logs scorer.describe(metrics, done)
"""

from __future__ import annotations

from typing import Callable

import torch

from gpt2.config.tree import Config
from gpt2.process.distributed import DistEnv
from gpt2.train.in_loop.core import InLoopCore
from gpt2.train.in_loop.hellaswag import InLoopHellaSwag


def scorers(cfg: Config, env: DistEnv, amp: torch.dtype | None, micro_batch: int,
            on_error: Callable[[Exception, str], None]) -> tuple[InLoopHellaSwag, InLoopCore]:
    return InLoopHellaSwag(cfg, env, amp, micro_batch, on_error), InLoopCore(cfg, env, amp, on_error)

