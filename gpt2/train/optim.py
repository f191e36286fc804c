"""AdamW with GPT-2's weight-decay groups (or Muon beside it, gpt2.train.muon),
and the learning-rate schedule.

Weight decay applies to 2-D weights (matmuls and embeddings) only; biases and
LayerNorm gains are not decayed (nanoGPT, llm.c). The schedule is a linear
warmup to `train.lr`, then a cosine or linear decay to `min_lr_ratio × lr`
at `max_steps`.

With `runtime.shard_optimizer` on several ranks the same AdamW runs as ZeRO-1
(torch's ZeroRedundancyOptimizer): each rank keeps the moments of its share of
the parameters, steps that share and broadcasts it. Each rank checkpoints the
state it keeps (gpt2.checkpoint.optim_share), and the shares merged are a plain
AdamW's state, so any run resumes under any setting and any number of ranks.
"""

from __future__ import annotations

import functools
import logging
import math

import torch
import torch.distributed as dist

from gpt2.checkpoint.optim_share import is_sharded
from gpt2.config.train import TrainConfig
from gpt2.errors import UserError

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


@functools.cache
def _sharded(optimizer_class: type) -> type:
    """Sharded<optimizer_class> (ShardedAdamW, ShardedMuonAdamW), defined on
    first use: importing torch.distributed.optim scripts its functional
    optimizers, seconds that most runs never need."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    class Sharded(ZeroRedundancyOptimizer):
        """`optimizer_class` as ZeRO-1 whose `state_dict` (after `consolidate_state_dict`
        on every rank) is exactly the plain optimizer's: the same parameter indices and group keys."""

        def state_dict(self) -> dict:
            full = super().state_dict()
            # ZeRO's own groups carry only the keys it was built with; the local
            # AdamW's carry all of AdamW's (amsgrad, foreach, ...), synced to these.
            full["param_groups"] = [{**{k: v for k, v in local.items() if k != "params"}, **group}
                                    for local, group in zip(self.optim.param_groups, full["param_groups"])]
            return full

        def load_state_dict(self, state_dict: dict) -> None:
            # ZeRO blanks the other ranks' entries of the dict it is given: give it its own.
            # 0-dim tensors (`step`) go as numbers: ZeRO would copy them to the
            # parameter's device and then force them onto the CPU, where the fused
            # kernel cannot use them; `place_state` makes them tensors again.
            state = {i: {k: v.item() if torch.is_tensor(v) and v.dim() == 0 else v for k, v in entry.items()}
                     for i, entry in state_dict["state"].items()}
            super().load_state_dict({**state_dict, "state": state})

    Sharded.__name__ = Sharded.__qualname__ = f"Sharded{optimizer_class.__name__}"
    return Sharded


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device_type: str,
                   shard: bool = False, fused: bool | None = None) -> torch.optim.Optimizer:
    """AdamW (`train.optimizer=adamw`), or Muon for the blocks' matrices with
    AdamW for the rest (`muon`), AdamW fused into one kernel on CUDA
    (llm.c/nanoGPT); the lr is set each step. `shard`: ZeRO-1 over the
    process group (the plain optimizer on one rank). `fused`: the kernel
    choice (None: fused on CUDA only; tests run the fused CPU kernel with True)."""
    fused = device_type == "cuda" if fused is None else fused
    if cfg.optimizer == "muon":
        from gpt2.train.muon import MuonAdamW, muon_param_groups  # refuses a torch without Muon

        optimizer_class, groups, kwargs = MuonAdamW, muon_param_groups(model, cfg, fused), {}
    else:
        optimizer_class, groups = torch.optim.AdamW, param_groups(model, cfg.weight_decay)
        kwargs = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8, fused=fused)
    log.debug("%s: %s parameters per group (fused=%s)", optimizer_class.__name__,
              [sum(p.numel() for p in g["params"]) for g in groups], fused)
    if shard and dist.is_initialized() and dist.get_world_size() > 1:
        # The parameters live in one flat buffer per rank's share: after each step
        # ZeRO broadcasts world-size buffers instead of one tensor per parameter
        # (~580 broadcasts a step at 1558m).
        return _sharded(optimizer_class)(groups, optimizer_class=optimizer_class, parameters_as_bucket_view=True,
                                         **kwargs)
    return optimizer_class(groups, **kwargs)


def local_part(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """What this rank steps by itself: ZeRO's AdamW over its share of the
    parameters, or the optimizer itself. Stepping it needs no collective,
    which is what the micro-batch probe wants (each rank probes alone)."""
    return optimizer.optim if is_sharded(optimizer) else optimizer


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer state this rank keeps from step 2 on: AdamW's
    two moments of each parameter it steps, Muon's one momentum buffer."""
    return sum(p.numel() * p.element_size() * (1 if group.get("algorithm") == "muon" else 2)
               for group in local_part(optimizer).param_groups for p in group["params"])


def algorithms(param_groups: list[dict]) -> list[str]:
    """Which algorithm steps each group (AdamW's own groups say none)."""
    return [g.get("algorithm", "adamw") for g in param_groups]


def load_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load a checkpoint's AdamW state (written plain or sharded, fused or not,
    on any device and number of ranks) so the kernels this optimizer runs
    find every tensor where and as they expect it (`place_state`). State of
    another optimizer is refused before anything is loaded."""
    saved_as, ours = algorithms(saved["param_groups"]), algorithms(optimizer.param_groups)
    if saved_as != ours:
        was = "muon" if "muon" in saved_as else "adamw"
        raise UserError(f"the checkpoint holds the optimizer state of train.optimizer={was} "
                        f"(groups {saved_as}), this run builds {ours}: set train.optimizer={was} to resume "
                        "it, or start another run; the checkpoint is left as it is")
    # Kernel choices (fused/foreach) belong to this machine, not the checkpoint.
    # Given to the saved groups, so loading places the state by them, and
    # ZeRO-1 hands them on to its local AdamW.
    kernels = [{k: g[k] for k in ("fused", "foreach") if k in g} for g in optimizer.param_groups]
    groups = [{**group, **own} for group, own in zip(saved["param_groups"], kernels, strict=True)]
    optimizer.load_state_dict({**saved, "param_groups": groups})
    place_state(optimizer)


def _step_dtype(fused: bool) -> torch.dtype:
    """The dtype AdamW gives `step` when it creates it (torch.optim.optimizer._get_scalar_dtype)."""
    return torch.float32 if fused or torch.get_default_dtype() != torch.float64 else torch.float64


def place_state(optimizer: torch.optim.Optimizer) -> None:
    """Put this rank's AdamW state where its kernel wants it, as a fresh
    optimizer would have created it: moments on the parameter's device in its
    dtype; `step` a float32 tensor on the parameter's device for the fused
    (and capturable) kernels, else on the CPU. `Optimizer.load_state_dict`
    places `step` by the *saved* group's flags (a checkpoint written on the CPU
    says unfused) and ZeRO-1's always moves it to the CPU (PyTorch issue
    124133): the fused CUDA kernel then fails on the first resumed step."""
    local = local_part(optimizer)
    for group in local.param_groups:
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            state = local.state.get(p)
            for key, value in (state or {}).items():
                if key == "step":  # a tensor, or a number from ShardedAdamW.load_state_dict
                    state[key] = torch.as_tensor(value, dtype=_step_dtype(on_device),
                                                 device=p.device if on_device else "cpu")
                elif torch.is_tensor(value):
                    state[key] = value.to(device=p.device, dtype=p.dtype if value.is_floating_point() else None)


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
    """The schedule's lr for every group; Muon's group follows it at
    `train.muon_lr / train.lr` of it (its `lr_ratio`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_ratio", 1.0)
