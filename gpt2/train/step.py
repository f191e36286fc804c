"""One optimizer step, one validation pass, and the micro-batch search.

These are the pieces of the training loop that touch tensors; the loop itself
(gpt2.train.run) only sequences them, checkpoints and reports.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch.nn.parallel import DistributedDataParallel

from gpt2.process.distributed import DistEnv, all_reduce, autocast
from gpt2.train import memory
from gpt2.train.optim import local_part, state_bytes
from gpt2.train.precision import LossScaler
from gpt2.train.throughput import synchronize

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class StepContext:
    """What every step needs besides the model: device, precision, limits."""

    env: DistEnv
    amp: torch.dtype | None
    grad_clip: float
    memory_limit_mb: int | None = None
    scaler: LossScaler | None = None
    """fp16's loss scaler (gpt2.train.precision); None in bf16 and fp32."""


def train_step(model: torch.nn.Module, raw_model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               batches: list[Batch], ctx: StepContext) -> tuple[float, float]:
    """Forward/backward over the micro-batches (gradient accumulation), clip,
    AdamW step. Returns (mean loss over ranks, gradient norm before clipping)."""
    loss, norm, _ = train_step_with_flags(model, raw_model, optimizer, batches, ctx, lambda: ())
    return loss, norm


def train_step_with_flags(model: torch.nn.Module, raw_model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                          batches: list[Batch], ctx: StepContext, flags: Callable[[], Sequence[bool]],
                          keep_update: Callable[[float, float], bool] | None = None
                          ) -> tuple[float, float, list[bool]]:
    """`train_step`, also agreeing on this rank's `flags` (read just before
    the loss all-reduce, which carries them): each is returned true on every
    rank when it was true on any, with no collective of its own.

    The host waits for the device once, at the end (`.tolist()`); the batches
    are copied with non_blocking=True (asynchronous from pinned memory).
    With `keep_update(loss, grad_norm)` that one read comes before the
    optimizer step instead, and the optimizer steps only if it answers True
    (train.on_spike=skip): a dropped update leaves the optimizer state as it
    was. Every rank reads the same all-reduced numbers, so all agree. fp16's loss scaler unscales
    before clipping and skips a step with an inf/nan gradient (not a spike: no `keep_update`)."""
    device, scaler = ctx.env.device, ctx.scaler
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=device)
    for i, (x, y) in enumerate(batches):
        loss_sum += _forward_backward(model, raw_model, optimizer, x, y, ctx, len(batches), i == len(batches) - 1)
    # Filled on the device (no host-to-device copy, which would wait for the queued work).
    carried = torch.stack([loss_sum, *(torch.full_like(loss_sum, float(f)) for f in flags())])
    all_reduce(carried, ctx.env)  # the mean: a flag true on any rank stays > 0
    if scaler is not None:
        scaler.unscale(optimizer)
    max_norm = ctx.grad_clip if ctx.grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), max_norm)
    step = scaler.step if scaler is not None else (lambda opt: opt.step())
    if keep_update is None:
        step(optimizer)
    # The one host sync, for all the numbers, after the optimizer step is queued
    # (before it, where the numbers decide whether it runs).
    loss_value, norm_value, *agreed = torch.cat([carried[:1], norm.to(loss_sum.dtype).reshape(1),
                                                 carried[1:]]).tolist()
    overflow = scaler is not None and math.isfinite(loss_value) and not math.isfinite(norm_value)
    if keep_update is not None and not overflow and keep_update(loss_value, norm_value):
        step(optimizer)
    if scaler is not None:
        scaler.update(norm_value)
    return loss_value, norm_value, [v > 0 for v in agreed]


def _forward_backward(model: torch.nn.Module, raw_model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      x: torch.Tensor, y: torch.Tensor, ctx: StepContext, micro_batches: int,
                      last: bool) -> torch.Tensor:
    """One micro-batch's forward and backward; returns its share of the step's loss (detached)."""
    device = ctx.env.device
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    # DDP all-reduces gradients only after the last micro-batch.
    sync = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else contextlib.nullcontext()
    with sync:
        # The state's bytes only where a limit is emulated: not a walk over every parameter per micro-batch.
        kept = state_bytes(optimizer) if ctx.memory_limit_mb is not None and device.type == "cpu" else None
        with autocast(device, ctx.amp), memory.cpu_limit(raw_model, device, ctx.memory_limit_mb, kept):
            _, loss = model(x, y, return_logits=False)
        # The mean over the whole global batch, not the sum of micro-batch means.
        loss = loss / micro_batches
        (ctx.scaler.scale(loss) if ctx.scaler is not None else loss).backward()
    return loss.detach()


def warm_up(model: torch.nn.Module, raw_model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            micro_batch: int, seq_len: int, ctx: StepContext) -> None:
    """Compile the training step's and the validation's programs on stand-in
    batches of the run's shape before the first real batch is read: the first
    shards' download (gpt2.data.loader.first_reads) runs beside the compile
    instead of before it, and the validation's program is in the compiled
    program the run saves after its first step (gpt2.train.compile_cache).

    Trains nothing: the gradients are dropped, the optimizer is not stepped,
    the RNG is restored. Under DDP every rank runs it, and its all-reduce is
    what the first step's would have been (the reducer's first pass)."""
    device = ctx.env.device
    # Two tensors, as a real batch has: inputs that alias the targets would be another program.
    x, y = (torch.zeros((micro_batch, seq_len), dtype=torch.long, device=device) for _ in range(2))
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        _forward_backward(model, raw_model, optimizer, x, y, ctx, micro_batches=1, last=True)
        optimizer.zero_grad(set_to_none=True)
        evaluate(unwrapped(model), [(x, y)], ctx)
    synchronize(device)


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP (a validation pass needs no gradient hooks)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[Batch], ctx: StepContext) -> float:
    """Mean token loss over the whole validation set (every rank's share)."""
    device = ctx.env.device
    model.eval()
    loss_sum, count = torch.zeros((), device=device, dtype=torch.float64), 0
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, ctx.amp):
            _, loss = model(x, y, return_logits=False)
        loss_sum += loss.double() * y.numel()
        count += y.numel()  # counted on the host: no copy to the device per batch
    model.train()
    total = torch.stack([loss_sum, torch.full_like(loss_sum, float(count))])  # [loss sum, token count]
    all_reduce(total, ctx.env, op="sum")
    return (total[0] / total[1]).item()


def divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def micro_batch_candidates(seqs_per_rank: int) -> Iterator[int]:
    """The micro-batches `auto` tries, in order: the largest divisor of
    `seqs_per_rank`, then each time the largest divisor at most half the last."""
    candidates = divisors_desc(seqs_per_rank)
    batch = candidates[0]
    while True:
        yield batch
        smaller = [d for d in candidates if d <= batch // 2]
        if not smaller:
            return
        batch = smaller[0]


# Recomputation costs about a third more compute per step, while halving the
# micro-batch costs little as long as it stays this large (the matmuls stay
# big enough to keep the GPU busy): `auto` only recomputes rather than halve
# below this many sequences.
RECOMPUTE_FLOOR = 8


@dataclass(frozen=True)
class MemorySettings:
    """runtime.shard_optimizer and runtime.recompute as resolved for this run."""

    shard_optimizer: bool = False
    recompute: bool = False


def configured(shard_optimizer: bool | str, recompute: bool | str, world_size: int) -> MemorySettings:
    """The settings as given: `auto` off, ZeRO-1 only with several ranks."""
    return MemorySettings(shard_optimizer is True and world_size > 1, recompute is True)


def memory_candidates(seqs_per_rank: int, shard_optimizer: bool | str, recompute: bool | str,
                      world_size: int) -> Iterator[tuple[int, MemorySettings]]:
    """What `auto` tries, in order, as (micro-batch, settings): at each size of
    `micro_batch_candidates`, the settings as configured; then ZeRO-1 (when
    shard_optimizer is auto and there are several ranks); then also
    recomputation (when recompute is auto), but only where the next size would
    fall below RECOMPUTE_FLOOR. Explicit true/false settings never change."""
    base = configured(shard_optimizer, recompute, world_size)
    sizes = list(micro_batch_candidates(seqs_per_rank))
    for i, batch in enumerate(sizes):
        tries = [base]
        if shard_optimizer == "auto" and world_size > 1:
            tries.append(MemorySettings(True, base.recompute))
        following = sizes[i + 1] if i + 1 < len(sizes) else 0
        if recompute == "auto" and following < RECOMPUTE_FLOOR:
            tries.append(MemorySettings(tries[-1].shard_optimizer, True))
        yield from ((batch, settings) for settings in tries)


def _probe(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: int,
           seq_len: int, vocab: int, ctx: StepContext, accumulating: bool = False) -> None:
    """A real forward, backward and optimizer step at (batch, seq_len), in
    the memory of a step from step 2 on (memory.steady_state): AdamW's
    moments already resident and, when training runs under DDP or
    accumulates several micro-batches a step (`accumulating`: from the second
    micro-batch on, every gradient is there before the forward), the
    gradients too; and on CUDA with several ranks, NCCL's buffers."""
    # A private generator: the search must not move the global RNG, so a run
    # with `auto` trains exactly like one given the chosen size.
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen).to(ctx.env.device)
    with memory.steady_state(model, optimizer, ddp=ctx.env.is_distributed or accumulating), \
            memory.communication_reserve(ctx.env.device, ctx.env.world_size):
        scaler = LossScaler(ctx.env.device.type) if ctx.scaler is not None else None  # the run's scale stays
        train_step(model, model, optimizer, [(x[:, :-1], x[:, 1:])],
                   StepContext(env=_local(ctx.env), amp=ctx.amp, grad_clip=1.0, memory_limit_mb=ctx.memory_limit_mb,
                               scaler=scaler))
        synchronize(ctx.env.device)


def _local(env: DistEnv) -> DistEnv:
    """The probe runs on each rank alone (no collectives, no hang if one rank OOMs)."""
    return DistEnv(rank=0, local_rank=env.local_rank, world_size=1, device=env.device)


class MicroBatch(int):
    """A micro-batch size (an int, as it always was) that also carries the
    memory settings it fits with."""

    memory: MemorySettings

    def __new__(cls, size: int, memory: MemorySettings) -> MicroBatch:
        self = super().__new__(cls, size)
        self.memory = memory
        return self


def find_micro_batch(model: torch.nn.Module, make_opt: Callable[..., torch.optim.Optimizer],
                     seqs_per_rank: int, seq_len: int, vocab: int, ctx: StepContext,
                     shard_optimizer: bool | str = False, recompute: bool | str = False) -> MicroBatch:
    """The largest micro-batch dividing `seqs_per_rank` whose full training
    step fits in memory, trying the memory settings of `memory_candidates`
    before halving; the same on every rank. `make_opt()` builds the optimizer,
    `make_opt(True)` its ZeRO-1 form (asked for only when a candidate shards)."""
    def build(shard: bool) -> torch.optim.Optimizer:
        return make_opt(True) if shard else make_opt()

    return MicroBatch(*find_memory_fit(model, build, seqs_per_rank, seq_len, vocab, ctx, shard_optimizer, recompute))


def find_memory_fit(model: torch.nn.Module, make_opt: Callable[[bool], torch.optim.Optimizer],
                    seqs_per_rank: int, seq_len: int, vocab: int, ctx: StepContext,
                    shard_optimizer: bool | str = False, recompute: bool | str = False) -> tuple[int, MemorySettings]:
    """The first of `memory_candidates` whose full training step fits,
    probed for real; the same on every rank (the latest any rank needed).
    `make_opt(shard)` builds the optimizer (ZeRO-1 when `shard`); each rank
    steps only its own part of it, without collectives. `model.recompute`
    is left as chosen."""
    snapshot = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    candidates = list(memory_candidates(seqs_per_rank, shard_optimizer, recompute, ctx.env.world_size))
    choice = len(candidates)
    try:
        for i, (batch, settings) in enumerate(candidates):
            model.recompute = settings.recompute
            optimizer = make_opt(settings.shard_optimizer)
            try:
                _probe(model, local_part(optimizer), batch, seq_len, vocab, ctx, accumulating=batch < seqs_per_rank)
                choice = i
                break
            except torch.OutOfMemoryError:
                memory.release(ctx.env.device)
                log.info("micro-batch %d x %d tokens does not fit (%s)", batch, seq_len, _describe(settings))
            finally:
                del optimizer
    finally:
        model.load_state_dict(snapshot)
        memory.release(ctx.env.device)
    chosen = int(all_reduce(torch.tensor([choice], device=ctx.env.device), ctx.env, op="max").item())
    if chosen == len(candidates):
        raise torch.OutOfMemoryError(
            f"even a micro-batch of 1 x {seq_len} tokens does not fit on {ctx.env.device} "
            f"({_describe(candidates[-1][1])}); use a smaller model.block_size or model, or a device with more memory"
        )
    batch, settings = candidates[chosen]
    model.recompute = settings.recompute
    return batch, settings


def _describe(settings: MemorySettings) -> str:
    return f"shard_optimizer={str(settings.shard_optimizer).lower()}, recompute={str(settings.recompute).lower()}"
