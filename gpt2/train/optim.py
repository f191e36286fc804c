"""AdamW with GPT-2's weight-decay groups, and the learning-rate schedule.

Weight decay applies to 2-D weights (matmuls and embeddings) only; biases and
LayerNorm gains are not decayed (nanoGPT, llm.c). The schedule is a linear
warmup to `train.lr`, then a cosine or linear decay to `min_lr_ratio × lr`
at `max_steps`.
"""

from __future__ import annotations

import logging
import math

import torch

from gpt2.config import TrainConfig

log = logging.getLogger(__name__)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: 2-D+ weights decayed, the rest (biases, LayerNorm) not.
    Tied weights appear once because `named_parameters` deduplicates them."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device_type: str) -> torch.optim.AdamW:
    """AdamW, fused into one kernel on CUDA (llm.c/nanoGPT); the lr is set each step."""
    groups = param_groups(model, cfg.weight_decay)
    fused = device_type == "cuda"
    n_decay = sum(p.numel() for p in groups[0]["params"])
    n_plain = sum(p.numel() for p in groups[1]["params"])
    log.debug("AdamW: %d decayed / %d non-decayed parameters (fused=%s)", n_decay, n_plain, fused)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8, fused=fused)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based).

    Warmup reaches the peak at step warmup_steps - 1 (so step 0 already moves
    the weights), then decays so the last step uses min_lr_ratio × lr."""
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps
    decay_steps = cfg.max_steps - cfg.warmup_steps
    if decay_steps <= 1:
        return peak
    progress = min(1.0, (step - cfg.warmup_steps) / (decay_steps - 1))
    if cfg.decay == "cosine":
        coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        coeff = 1.0 - progress
    return floor + coeff * (peak - floor)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
