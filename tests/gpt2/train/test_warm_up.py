"""The compile warm-up (gpt2.train.step.warm_up): before the first real batch,
the step's and the validation's programs are compiled on stand-in batches;
the run then trains exactly as a cold one does.

dynamo's `aot_eager` backend: the guards and graphs that decide whether the
first step compiles again are dynamo's own, whatever the backend, and this
one needs no C++ compiler (inductor's path: tests/gpt2/train/test_warm_restart.py)."""

from __future__ import annotations

import torch

from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv
from gpt2.train.optim import make_optimizer
from gpt2.train.step import StepContext, evaluate, train_step, warm_up

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
CFG = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16)
MICRO = 4


def _run():
    torch.manual_seed(0)
    raw = GPT(CFG)
    return raw, torch.compile(raw, dynamic=False, backend="aot_eager"), make_optimizer(raw, TrainConfig(), "cpu")


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, CFG.vocab_size, (n, MICRO, CFG.block_size + 1), generator=g)
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in x]


def _train(raw, model, optimizer, ctx) -> list[float]:
    """A step of two micro-batches, then a validation pass."""
    return [train_step(model, raw, optimizer, _batches(2), ctx)[0], evaluate(model, _batches(1), ctx)]


def test_the_warm_up_compiles_the_first_steps_programs_and_trains_nothing():
    from torch._dynamo.utils import counters  # here, not at collection: ~1 s of import in every pytest worker
    ctx = StepContext(CPU, None, 1.0)
    raw, model, optimizer = _run()
    rng = torch.get_rng_state()
    warm_up(model, raw, optimizer, MICRO, CFG.block_size, ctx)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in raw.parameters()) and not optimizer.state
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0
    warm = _train(raw, model, optimizer, ctx)
    # The training step (forward, backward) and the validation pass were compiled already.
    assert counters["stats"]["unique_graphs"] == compiled

    torch._dynamo.reset()  # a cold start: nothing compiled in this process yet
    before = counters["stats"]["unique_graphs"]
    cold_raw, cold_model, cold_optimizer = _run()
    assert _train(cold_raw, cold_model, cold_optimizer, ctx) == warm
    assert counters["stats"]["unique_graphs"] > before  # it compiled in its first step
    for a, b in zip(raw.state_dict().values(), cold_raw.state_dict().values()):
        assert torch.equal(a, b)
