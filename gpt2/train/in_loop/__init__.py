"""What the training loop scores between steps, on every rank, each at its own interval (and at
the last step): HellaSwag's native scorer (`hellaswag`, eval.every_steps) and a subsampled CORE
(`core`, eval.core_every). Rank 0 logs the sums to the training run at the step.

    for metrics in (scorer(model, done) for scorer in scorers(cfg, env, amp, micro_batch, on_error)): ...
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


def describe(metrics: dict[str, float], done: int) -> str:
    """The log line of one scorer's metrics: HellaSwag's all, CORE's score (its tasks are in MLflow)."""
    if "core/score" in metrics:
        tasks = sum(1 for k in metrics if k.endswith("/centered"))
        return f"CORE at step {done}: {metrics['core/score']:.4f} over {tasks} tasks"
    return f"HellaSwag at step {done}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
