"""Learning-rate schedule and AdamW weight-decay groups."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.train.optim import lr_at, make_optimizer, param_groups


def test_warmup_is_linear_and_reaches_the_peak():
    cfg = TrainConfig(lr=6e-4, warmup_steps=700, max_steps=19_073, min_lr_ratio=0.0)
    assert lr_at(0, cfg) == pytest.approx(6e-4 / 700)
    assert lr_at(349, cfg) == pytest.approx(6e-4 * 350 / 700)
    assert lr_at(699, cfg) == pytest.approx(6e-4)


def test_cosine_decays_to_the_floor_at_the_last_step():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=110, min_lr_ratio=0.1, decay="cosine")
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(109, cfg) == pytest.approx(1e-4)
    # Half-way through the decay the cosine sits at the midpoint.
    mid = 10 + (110 - 10 - 1) / 2
    assert lr_at(int(mid), cfg) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * int(mid - 10) / 99)) * 9e-4)
    lrs = [lr_at(s, cfg) for s in range(10, 110)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_linear_decay_is_a_straight_line():
    cfg = TrainConfig(lr=1e-3, warmup_steps=0, max_steps=11, min_lr_ratio=0.0, decay="linear")
    assert [lr_at(s, cfg) for s in range(11)] == pytest.approx([1e-3 * (1 - s / 10) for s in range(11)])


def test_weight_decay_only_on_2d_weights():
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16))
    decay, plain = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = sorted(names[id(p)] for p in decay["params"])
    undecayed = sorted(names[id(p)] for p in plain["params"])
    assert decay["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert "transformer.wte.weight" in decayed and "transformer.h.0.attn.c_attn.weight" in decayed
    assert all(n.endswith(".weight") and "ln_" not in n for n in decayed)
    assert all(n.endswith(".bias") or "ln_" in n for n in undecayed)
    # Every parameter exactly once (the tied head is the embedding).
    assert len(decayed) + len(undecayed) == len(list(model.parameters()))


def test_weight_decay_moves_only_decayed_params_without_gradients():
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))
    opt = make_optimizer(model, TrainConfig(weight_decay=0.5, lr=0.1), "cpu")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # only decay can move a weight now
    opt.step()
    for n, p in model.named_parameters():
        moved = not torch.equal(p, before[n])
        assert moved == (p.dim() >= 2 and before[n].abs().sum() > 0), n
