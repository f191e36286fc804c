"""`train.optimizer=muon`: Muon for the blocks' weight matrices, AdamW for the rest.

Muon (torch.optim.Muon, torch >= 2.9) orthogonalizes each matrix's momentum
with a few Newton-Schulz iterations; it is defined for the hidden 2-D
matrices only. The token embedding (tied to the head), the position
embedding, the LayerNorm gains and the biases stay with AdamW, as in the
public GPT-2 speedruns, each group with its weight decay as today.

Both run as one `torch.optim.Optimizer` (`MuonAdamW`): its groups say which
algorithm steps them, and its `state_dict` is an ordinary one over all the
parameters. So everything built for AdamW's state works unchanged: the
per-rank shares of a checkpoint, their merge under any rank count, ZeRO-1
(which gives each rank whole parameters, and Newton-Schulz needs whole
matrices), the resume. Learning rates use `adjust_lr_fn="match_rms_adamw"`
(Muon's update scaled to AdamW's RMS), so the preset's lr and schedule carry
over; `train.muon_lr` sets Muon's peak apart.
"""

from __future__ import annotations

import torch

from gpt2.errors import UserError

MUON_KEYS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
"""The blocks' weight matrices: the parameters Muon steps."""


def require_muon() -> type:
    """torch.optim.Muon, or a clear error naming the setting and the torch it needs."""
    muon = getattr(torch.optim, "Muon", None)
    if muon is None:
        raise UserError(f"train.optimizer=muon needs torch.optim.Muon (torch >= 2.9); this torch is "
                        f"{torch.__version__}: install torch 2.9 or newer, or set train.optimizer=adamw")
    return muon


def is_muon_param(name: str, p: torch.Tensor) -> bool:
    return p.dim() == 2 and name.startswith("transformer.h.") and name.endswith(MUON_KEYS)


def muon_param_groups(model: torch.nn.Module, cfg, fused: bool) -> list[dict]:
    """Three groups, each carrying every setting of the algorithm that steps
    it: AdamW's decayed (embeddings) and non-decayed (biases, LayerNorm)
    parameters, then Muon's matrices. Tied weights appear once."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matrices = [p for n, p in named if is_muon_param(n, p)]
    rest = [(n, p) for n, p in named if not is_muon_param(n, p)]
    adamw = dict(algorithm="adamw", lr=cfg.lr, lr_ratio=1.0, betas=tuple(cfg.betas), eps=1e-8, fused=fused)
    muon_lr = cfg.muon_lr if cfg.muon_lr is not None else cfg.lr
    return [
        {**adamw, "params": [p for _, p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {**adamw, "params": [p for _, p in rest if p.dim() < 2], "weight_decay": 0.0},
        dict(algorithm="muon", params=matrices, lr=muon_lr, lr_ratio=muon_lr / cfg.lr,
             weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum, adjust_lr_fn="match_rms_adamw"),
    ]


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over groups tagged `algorithm: adamw | muon`.

    Each step hands the groups of each algorithm, and the shared state, to a
    torch.optim.AdamW and a torch.optim.Muon built once: the groups are
    re-read every step because `load_state_dict` replaces them (and the
    state) with new objects. `defaults` is unused: every group carries its
    settings (ZeRO-1 passes its own keyword arguments here)."""

    ALGORITHMS = ("adamw", "muon")

    def __init__(self, params, **defaults) -> None:
        groups = [dict(g) for g in params]
        unknown = {g.get("algorithm") for g in groups} - set(self.ALGORITHMS)
        if unknown:
            raise ValueError(f"MuonAdamW: groups need algorithm in {self.ALGORITHMS}, got {sorted(map(str, unknown))}")
        muon = require_muon()
        super().__init__(groups, {})
        # Built over the very group dicts, so each fills in its own defaults
        # (amsgrad, nesterov, ns_steps, ...) and they are saved with the state.
        adamw = self._groups("adamw")
        self._steppers = {
            "adamw": torch.optim.AdamW(adamw or [{"params": []}], fused=any(g.get("fused") for g in adamw) or None),
            "muon": muon(self._groups("muon") or [{"params": []}]),
        }

    def _groups(self, algorithm: str) -> list[dict]:
        return [g for g in self.param_groups if g["algorithm"] == algorithm]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for algorithm, stepper in self._steppers.items():
            stepper.param_groups, stepper.state = self._groups(algorithm), self.state
            stepper.step()
        return loss
