"""The step functions: accumulation, bf16 autocast (the CUDA path, run on CPU),
validation independent of micro-batch size, and the memory-limited search."""

from __future__ import annotations

import copy

import pytest
import torch

from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv
from gpt2.train.optim import make_optimizer
from gpt2.train.step import StepContext, divisors_desc, evaluate, find_micro_batch, train_step

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
CFG = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16)


def _model():
    torch.manual_seed(0)
    return GPT(CFG)


def _data(n=8):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 50257, (n, 17), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def test_accumulation_equals_one_big_batch():
    x, y = _data()
    a, b = _model(), _model()
    oa, ob = make_optimizer(a, TrainConfig(), "cpu"), make_optimizer(b, TrainConfig(), "cpu")
    ctx = StepContext(CPU, None, 1.0)
    la, na = train_step(a, a, oa, [(x, y)], ctx)
    lb, nb = train_step(b, b, ob, [(x[:2], y[:2]), (x[2:4], y[2:4]), (x[4:6], y[4:6]), (x[6:], y[6:])], ctx)
    assert la == pytest.approx(lb, rel=1e-6) and na == pytest.approx(nb, rel=1e-5)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)


def test_bf16_autocast_step_tracks_fp32():
    x, y = _data()
    a, b = _model(), _model()
    oa, ob = make_optimizer(a, TrainConfig(), "cpu"), make_optimizer(b, TrainConfig(), "cpu")
    l32, _ = train_step(a, a, oa, [(x, y)], StepContext(CPU, None, 1.0))
    l16, _ = train_step(b, b, ob, [(x, y)], StepContext(CPU, torch.bfloat16, 1.0))
    assert l16 != l32 and l16 == pytest.approx(l32, rel=1e-2)
    assert all(p.dtype == torch.float32 for p in b.parameters())  # master weights stay fp32


def test_validation_loss_does_not_depend_on_micro_batch():
    x, y = _data(7)
    model = _model()
    ctx = StepContext(CPU, None, 1.0)
    whole = evaluate(model, [(x, y)], ctx)
    pieces = evaluate(model, [(x[:3], y[:3]), (x[3:6], y[3:6]), (x[6:], y[6:])], ctx)
    assert whole == pytest.approx(pieces, rel=1e-6)
    assert model.training  # evaluate restores train mode


def test_gradient_clipping_bounds_the_update():
    x, y = _data()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = copy.deepcopy(model.state_dict())
    _, norm = train_step(model, model, opt, [(x, y)], StepContext(CPU, None, grad_clip=1e-3))
    assert norm > 1e-3  # reported before clipping
    moved = sum((p - before[n]).pow(2).sum() for n, p in model.named_parameters() if n != "lm_head.weight")
    assert moved.sqrt().item() == pytest.approx(1e-3, rel=1e-3)


def test_search_halves_until_it_fits_and_leaves_the_weights_alone():
    assert divisors_desc(12) == [12, 6, 4, 3, 2, 1]
    model = _model()
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    ctx = StepContext(CPU, None, 1.0, memory_limit_mb=30)
    make = lambda: make_optimizer(model, TrainConfig(), "cpu")  # noqa: E731
    chosen = find_micro_batch(model, make, 12, 16, 50304, ctx)
    assert chosen in (6, 4, 3, 2, 1) and chosen < 12
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    generous = find_micro_batch(model, make, 12, 16, 50304, StepContext(CPU, None, 1.0, memory_limit_mb=4096))
    assert generous == 12


def test_a_model_larger_than_the_limit_says_so():
    ctx = StepContext(CPU, None, 1.0, memory_limit_mb=1)
    model = _model()
    with pytest.raises(torch.OutOfMemoryError, match="micro-batch of 1"):
        find_micro_batch(model, lambda: make_optimizer(model, TrainConfig(), "cpu"), 4, 16, 50304, ctx)
