"""Device-to-host synchronisations in one optimizer step: one, after the
optimizer step is queued, reading the loss, the gradient norm and the stop
flags together; none per micro-batch.

On CUDA each of these waits for the GPU to drain its queue; on an H100
`torch.cuda.set_sync_debug_mode("warn")` counted exactly one in train_step
(bench/results.jsonl, `host_syncs`). Here a TorchFunctionMode counts the
calls that would synchronize a device tensor (reading a value: item, tolist,
bool, float, int, printing; copying it to the host), so a new one fails the
test on the CPU as well."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv
from gpt2.train.optim import make_optimizer
from gpt2.train.step import StepContext, train_step_with_flags

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
T = torch.Tensor
READS = {T.item, T.tolist, T.__bool__, T.__float__, T.__int__, T.__index__, T.numpy, T.__format__, T.__repr__,
         T.__str__, T.cpu}


class CountHostReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS or (func is T.to and _to_host(args, kwargs)):
            self.reads.append(getattr(func, "__name__", str(func)))
        return func(*args, **kwargs)


def _to_host(args, kwargs) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu" and args[0].device.type != "cpu"


def _step(micro_batches: int, flags=lambda: (False, False, True)):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))
    # Fused AdamW, as on CUDA: its step counts stay tensors (the foreach kernel reads
    # each parameter's count with .item(), host-side there, but a read all the same here).
    opt = make_optimizer(model, TrainConfig(), "cpu", fused=True)
    x = torch.randint(0, 50257, (2, 16))
    batches = [(x, x)] * micro_batches
    ctx = StepContext(CPU, None, 1.0)
    train_step_with_flags(model, model, opt, batches, ctx, flags)  # first step: the optimizer's state is made
    with CountHostReads() as counter:
        out = train_step_with_flags(model, model, opt, batches, ctx, flags)
    return counter.reads, out


def test_one_read_per_step_whatever_the_accumulation():
    for micro_batches in (1, 4):
        reads, (loss, norm, agreed) = _step(micro_batches)
        assert reads == ["tolist"], (micro_batches, reads)
        # ... and that one read carries everything the loop needs: loss, norm and the flags.
        assert isinstance(loss, float) and isinstance(norm, float) and agreed == [False, False, True]


def test_the_counter_sees_a_read_of_a_value():
    """The hook is live: a step function that also read its loss per
    micro-batch (the usual `loss.item()` in a logging line) would be caught."""
    with CountHostReads() as counter:
        t = torch.ones(2) * 3
        float(t.sum()), t.sum().item(), bool(t.any()), t.tolist(), f"{t.sum():.1f}"
    assert counter.reads == ["__float__", "item", "__bool__", "tolist", "__format__"]
