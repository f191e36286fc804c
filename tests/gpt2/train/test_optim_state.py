"""A loaded optimizer's state sits where its kernel wants it: whatever wrote
the checkpoint (plain or ZeRO-1, fused or not, on the CPU), the moments lie on
the parameter's device and `step` is a float32 tensor on that device for the
fused kernel (on the CPU otherwise), as a fresh optimizer would create them.

Meta-device parameters stand in for a GPU: a device the checkpoint was not
written on, so a tensor left behind on the CPU shows. The real fused CPU
kernel then resumes, alone and as ZeRO-1 on two gloo processes."""

from __future__ import annotations

import io
import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt2.model import GPT
from gpt2.train.optim import load_state, local_part, make_optimizer
from tests.gpt2.train.fixtures import tiny_config

# Ranks spawned from the warm interpreter (tests/warm_python): gloo and the code under test unchanged.
pytestmark = pytest.mark.usefixtures("warm_spawn")

CONFIG = tiny_config("memory://unused")


def _grads(model: GPT, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def _checkpoint(steps: int, fused: bool) -> tuple[GPT, dict]:
    """A model after `steps` AdamW steps and its optimizer state, through
    torch.save/torch.load(weights_only=True) as a checkpoint goes."""
    torch.manual_seed(0)
    model = GPT(CONFIG.model)
    opt = make_optimizer(model, CONFIG.train, "cpu", fused=fused)
    for step in range(steps):
        _grads(model, step)
        opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    return model, torch.load(buf, weights_only=True)


def _on_meta() -> GPT:
    """The model built on the meta device (`.to("meta")` would untie the head)."""
    with torch.device("meta"):
        return GPT(CONFIG.model)


def _assert_placed(opt: torch.optim.Optimizer, fused: bool) -> int:
    """Every state tensor of this rank's parameters where a fresh optimizer
    puts it; returns how many parameters have state."""
    local, n = local_part(opt), 0
    for group in local.param_groups:
        assert bool(group["fused"]) is fused
        for p in group["params"]:
            state = local.state[p]
            n += 1
            assert state["step"].dtype == torch.float32 and state["step"].dim() == 0
            assert state["step"].device == (p.device if fused else torch.device("cpu"))
            for key in ("exp_avg", "exp_avg_sq"):
                assert state[key].device == p.device and state[key].dtype == p.dtype, key
    return n


@pytest.mark.parametrize("saved_fused", [False, True])
@pytest.mark.parametrize("fused", [True, False])
def test_plain_adamw_state_lands_on_the_parameters_device(saved_fused, fused):
    _, saved = _checkpoint(2, saved_fused)
    model = _on_meta()
    opt = make_optimizer(model, CONFIG.train, "cpu", fused=fused)
    load_state(opt, saved)
    assert _assert_placed(opt, fused) == len(list(model.parameters()))


def test_the_fused_cpu_kernel_resumes_exactly_and_from_an_unfused_checkpoint():
    reference, _ = _checkpoint(3, fused=True)
    model, saved = _checkpoint(2, fused=True)
    opt = make_optimizer(model, CONFIG.train, "cpu", fused=True)
    load_state(opt, saved)
    _grads(model, 2)
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))

    # Written unfused (a CPU run), resumed fused (a GPU run): the kernel runs and counts on.
    model, saved = _checkpoint(2, fused=False)
    opt = make_optimizer(model, CONFIG.train, "cpu", fused=True)
    load_state(opt, saved)
    _assert_placed(opt, fused=True)
    _grads(model, 2)
    opt.step()
    assert {s["step"].item() for s in opt.state.values()} == {3.0}


def _zero_worker(rank: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    try:
        reference, _ = _checkpoint(3, fused=True)
        model, saved = _checkpoint(2, fused=False)
        # ZeRO-1 over meta parameters: only placement is looked at (no step, no collective).
        meta = _on_meta()
        sharded = make_optimizer(meta, CONFIG.train, "cpu", shard=True, fused=True)
        load_state(sharded, saved)
        placed = _assert_placed(sharded, fused=True)
        # The real fused CPU kernel as ZeRO-1, resumed from a fused plain checkpoint.
        model, saved = _checkpoint(2, fused=True)
        sharded = make_optimizer(model, CONFIG.train, "cpu", shard=True, fused=True)
        load_state(sharded, saved)
        _assert_placed(sharded, fused=True)
        _grads(model, 2)
        sharded.step()  # each rank steps its share, then broadcasts it
        same = all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
        with open(f"{tmp}/rank{rank}.json", "w") as f:
            json.dump({"placed": placed, "same": same, "type": type(sharded).__name__}, f)
    finally:
        dist.destroy_process_group()


def test_zero1_state_lands_on_the_parameters_device_and_resumes_the_fused_kernel(tmp_path):
    mp.spawn(_zero_worker, args=(str(tmp_path),), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["type"] == "ShardedAdamW" and r["same"] for r in ranks)
    # Each rank placed its own share, and the shares cover every parameter.
    assert all(r["placed"] > 0 for r in ranks)
    assert sum(r["placed"] for r in ranks) == len(list(GPT(CONFIG.model).parameters()))
