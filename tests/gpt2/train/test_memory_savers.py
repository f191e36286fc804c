"""Activation recomputation and the order in which `auto` tries ZeRO-1 and
recomputation before halving the micro-batch, on one CPU process under the
emulated memory limit (runtime.memory_limit_mb)."""

from __future__ import annotations

import copy

import torch

from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv
from gpt2.train import memory
from gpt2.train.optim import make_optimizer
from gpt2.train.step import (
    RECOMPUTE_FLOOR,
    MemorySettings,
    StepContext,
    find_memory_fit,
    find_micro_batch,
    memory_candidates,
)

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
# Deep and narrow, so that blocks (not the 50304-entry logits) hold a good
# share of the activations and recomputing them frees a measurable amount.
DEEP = ModelConfig(n_layer=16, n_head=2, n_embd=128, block_size=64)
PLAIN, ZERO, ZERO_RECOMPUTE = MemorySettings(), MemorySettings(True, False), MemorySettings(True, True)


def _model(cfg=DEEP):
    torch.manual_seed(0)
    return GPT(cfg)


def _grads(model, x, amp=None):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
        _, loss = model(x[:, :-1], x[:, 1:], return_logits=False)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_recompute_gives_the_same_loss_and_gradients():
    x = torch.randint(0, 50257, (4, 33), generator=torch.Generator().manual_seed(1))
    cfg = ModelConfig(n_layer=3, n_head=2, n_embd=32, block_size=32)
    for amp in (None, torch.bfloat16):
        plain, again = _model(cfg), _model(cfg)
        again.recompute = True
        loss_a, grads_a = _grads(plain, x, amp)
        loss_b, grads_b = _grads(again, x, amp)
        # Bit for bit: the recomputed forward runs the same kernels on the same inputs.
        assert torch.equal(loss_a, loss_b)
        assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


def test_recompute_keeps_less_for_backward():
    x = torch.randint(0, 50257, (2, 65), generator=torch.Generator().manual_seed(1))
    saved = {}
    for recompute in (False, True):
        model = _model()
        model.recompute = recompute
        sizes = {}

        def pack(t, sizes=sizes):
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x[:, :-1], x[:, 1:], return_logits=False)
        saved[recompute] = sum(sizes.values())
    assert saved[True] < 0.8 * saved[False]


def test_candidates_try_zero_then_recompute_before_halving_below_the_floor():
    assert RECOMPUTE_FLOOR == 8
    tried = list(memory_candidates(16, "auto", "auto", world_size=2))
    assert tried[:5] == [(16, PLAIN), (16, ZERO), (8, PLAIN), (8, ZERO), (8, ZERO_RECOMPUTE)]
    assert tried[-3:] == [(1, PLAIN), (1, ZERO), (1, ZERO_RECOMPUTE)]
    # One process: nothing to shard across; recomputation alone.
    assert list(memory_candidates(8, "auto", "auto", world_size=1))[:3] == [
        (8, PLAIN), (8, MemorySettings(False, True)), (4, PLAIN)]
    # Explicit settings are never changed.
    assert {s for _, s in memory_candidates(16, False, False, 2)} == {PLAIN}
    assert {s for _, s in memory_candidates(16, True, True, 2)} == {ZERO_RECOMPUTE}
    assert {s for _, s in memory_candidates(16, True, "auto", 1)} == {PLAIN, MemorySettings(False, True)}


def _fit(model, limit_mb, recompute):
    ctx = StepContext(CPU, None, 1.0, memory_limit_mb=limit_mb)
    make = lambda shard: make_optimizer(model, TrainConfig(), "cpu", shard)  # noqa: E731
    return find_memory_fit(model, make, 8, DEEP.block_size, DEEP.vocab_size, ctx, "auto", recompute)


def test_auto_recomputes_where_the_plain_step_does_not_fit_and_false_halves_instead():
    model = _model()
    before = copy.deepcopy(model.state_dict())
    # 8 x 64 tokens: the plain step needs ~310 MiB in this accounting, with
    # recomputation ~255 MiB, and 4 sequences plainly ~230 MiB.
    assert _fit(model, 1024, "auto") == (8, PLAIN) and model.recompute is False
    assert _fit(model, 280, "auto") == (8, MemorySettings(False, True)) and model.recompute is True
    assert _fit(model, 280, False) == (4, PLAIN) and model.recompute is False
    # The trainer's entry point: still the micro-batch as an int, now with the settings it needs.
    found = find_micro_batch(model, lambda shard=False: make_optimizer(model, TrainConfig(), "cpu", shard), 8,
                             DEEP.block_size, DEEP.vocab_size, StepContext(CPU, None, 1.0, memory_limit_mb=280),
                             "auto", "auto")
    assert found == 8 and found.memory == MemorySettings(False, True)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_emulated_limit_counts_only_this_ranks_optimizer_share():
    model = _model()
    params = list(model.parameters())
    full, half = memory.static_bytes(model), memory.static_bytes(model, params[::2])
    weights = sum(p.numel() * 4 for p in params)
    assert full == 4 * weights and half == 2 * weights + 2 * sum(p.numel() * 4 for p in params[::2])


def test_the_estimate_shrinks_with_zero_and_recomputation():
    args = (1_557_611_200, 48, 1600, 50304, 16 * 1024)
    plain = memory.estimate_step_bytes(*args)
    sharded = memory.estimate_step_bytes(*args, optimizer_shards=8)
    recomputed = memory.estimate_step_bytes(*args, recompute=True)
    assert abs((plain - sharded) - 7 * args[0]) <= 1  # AdamW's 8 bytes a parameter, 7/8 of them elsewhere
    assert recomputed < plain and memory.estimate_step_bytes(*args, 8, True) < min(sharded, recomputed)
