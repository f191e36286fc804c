"""The micro-batch probe runs in the memory of a step from step 2 on (AdamW's
moments resident, DDP's gradient buckets present), DDP and ZeRO-1 are built
with the settings that memory assumes, and the CPU emulation and `gpt2 plan`
count the same resident terms."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv
from gpt2.train import memory
from gpt2.train.optim import make_optimizer
from gpt2.train.parallel import DDP_BUCKETS, DEFAULT_BUCKET_CAP_MB, bucket_cap_mb, wrap_ddp
from gpt2.train.step import StepContext, find_micro_batch
from tests.tiers import scenario

# Ranks spawned from the warm interpreter (tests/warm_python): gloo and the code under test unchanged.
pytestmark = pytest.mark.usefixtures("warm_spawn")

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
CFG = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16)


def _model(cfg=CFG):
    torch.manual_seed(0)
    return GPT(cfg)


def _batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(0, 50257, (2, CFG.block_size + 1), generator=g) for _ in range(n)]
    return [(x[:, :-1], x[:, 1:]) for x in xs]


def _backward(model, batches) -> None:
    for x, y in batches:
        _, loss = model(x, y, return_logits=False)
        loss.backward()


def test_the_probe_steps_with_adamw_state_and_an_accumulating_steps_gradients_already_resident(monkeypatch):
    """Every try of the probe starts its forward pass with AdamW's moments in
    place. And on one rank, no DDP: a micro-batch smaller than the rank's share
    of the step means several micro-batches a step, and from the second on
    every gradient is resident before the forward pass; a probe that let
    backward allocate them one by one would pick a size the real step's later
    micro-batches cannot hold (#31). The whole share in one micro-batch holds
    none beforehand."""
    model = _model()
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    made, seen, buckets, resident = [], [], [], []

    class Recorded(memory.GradientBuckets):  # the real buffers, remembered
        def __init__(self, params):
            super().__init__(params)
            buckets.append(self)

    monkeypatch.setattr(memory, "GradientBuckets", Recorded)

    def before_forward(m, args):
        # What the optimizer holds, and the gradient bytes held for the step, as each forward pass starts.
        seen.append({k for p in m.parameters() for k in made[-1].state.get(p, {})})
        resident.append(sum(b.numel() for b in buckets[-1].buffers.values()) if buckets else 0)

    model.register_forward_pre_hook(before_forward)

    def make():
        made.append(make_optimizer(model, TrainConfig(), "cpu"))
        return made[-1]

    # 12 sequences a step: 12 fits at once (one micro-batch); under a tight limit only a smaller
    # one does, found after halving.
    for limit_mb, accumulates in ((4096, False), (30, True)):
        seen.clear()
        resident.clear()
        chosen = find_micro_batch(model, make, 12, CFG.block_size, 50304,
                                  StepContext(CPU, None, 1.0, memory_limit_mb=limit_mb))
        assert seen and all({"exp_avg", "exp_avg_sq", "step"} <= keys for keys in seen)
        assert (int(chosen) < 12) is accumulates
        assert resident[-1] == (n_params if accumulates else 0)  # the try that fit
    assert all(p.grad is None for p in model.parameters())  # the probe leaves no gradient behind


def test_gradient_buckets_hold_every_gradient_in_one_buffer_with_unchanged_values():
    plain, bucketed = _model(), _model()
    buckets = memory.GradientBuckets(bucketed.parameters())
    (buffer,) = buckets.buffers.values()
    assert buffer.numel() == sum(p.numel() for p in bucketed.parameters())
    for _ in range(2):  # twice: zero_grad(set_to_none) then backward lands in the buffer again
        plain.zero_grad(set_to_none=True)
        bucketed.zero_grad(set_to_none=True)
        _backward(plain, _batches(2))  # accumulated over two micro-batches, as training does
        _backward(bucketed, _batches(2))
        for p, q in zip(plain.parameters(), bucketed.parameters()):
            assert q.grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            assert torch.equal(p.grad, q.grad)
    buckets.remove()
    _backward(bucketed, _batches(1))
    assert all(p.grad.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
               for p in bucketed.parameters())


def test_steady_state_creates_the_moments_and_the_buckets_before_the_forward_pass():
    model = _model()
    optimizer = make_optimizer(model, TrainConfig(), "cpu")
    with memory.steady_state(model, optimizer, ddp=True):
        assert all({"exp_avg", "exp_avg_sq"} <= optimizer.state[p].keys() for p in model.parameters())
        assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none), as in training
        _backward(model, _batches(1))
        assert len({p.grad.untyped_storage().data_ptr() for p in model.parameters()}) == 1
    assert all(p.grad is None for p in model.parameters())


def test_the_emulation_and_the_plan_count_the_same_resident_terms():
    model = _model()
    n = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert memory.static_bytes(model) == memory.resident_bytes(weights, weights)
    # Without tokens the estimate is the resident part (bf16 weights for autocast) plus the reserve.
    for shards in (1, 4):
        estimate = memory.estimate_step_bytes(n, CFG.n_layer, CFG.n_embd, CFG.vocab_size, 0, optimizer_shards=shards)
        assert estimate == int(memory.RESERVED_BYTES + memory.resident_bytes(4 * n, 4 * n / shards, 2 * n))


def test_ddp_buckets_come_in_a_few_pieces_whatever_the_model_size():
    for cfg in (ModelConfig(), ModelConfig(n_layer=48, n_head=25, n_embd=1600)):  # 124M, 1558M
        with torch.device("meta"):
            model = GPT(cfg)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        pieces = grad_bytes / (bucket_cap_mb(model) << 20)
        assert DDP_BUCKETS - 1 < pieces <= DDP_BUCKETS
    assert bucket_cap_mb(_model()) == DEFAULT_BUCKET_CAP_MB  # a tiny model keeps DDP's default


def _parallel_worker(rank: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    try:
        model = _model()
        env = DistEnv(rank, rank, 2, torch.device("cpu"))
        zero = make_optimizer(model, TrainConfig(), "cpu", shard=True)
        ddp = wrap_ddp(model, model, env)
        _backward(ddp, _batches(1, seed=rank))
        zero.step()
        report = {
            "zero_bucket_view": zero.parameters_as_bucket_view,
            # One flat buffer per rank's share holds the parameters.
            "param_storages": len({p.untyped_storage().data_ptr() for p in model.parameters()}),
            "ddp_bucket_view": ddp.gradient_as_bucket_view,
            "ddp_bucket_bytes": ddp.bucket_bytes_cap,
            "grads_are_views": all(p.grad._is_view() for p in model.parameters()),
            "weights": [p.detach().sum().item() for p in model.parameters()],
        }
        with open(f"{tmp}/rank{rank}.json", "w") as f:
            json.dump(report, f)
        # DDP's reducer must not be what frees the group (gpt2.process.distributed's `_retired` says why).
        del ddp, zero
    finally:
        dist.destroy_process_group()


@scenario
def test_ddp_and_zero1_are_built_with_bucket_views_and_sized_buckets(tmp_path):
    mp.spawn(_parallel_worker, args=(str(tmp_path),), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["zero_bucket_view"] is True and r["param_storages"] == 2
        assert r["ddp_bucket_view"] is True and r["grads_are_views"] is True
        assert r["ddp_bucket_bytes"] == bucket_cap_mb(_model()) << 20
    assert ranks[0]["weights"] == ranks[1]["weights"]  # ZeRO broadcast every rank's updated share

