"""Device memory limits: `runtime.memory_limit_mb` and what counts as an OOM.

What a training step needs is its steady state, from step 2 on: the weights,
their gradients (under DDP with gradient_as_bucket_view, its bucket buffers,
which are the gradients), AdamW's two moments for the parameters this rank
steps (all of them, or its ZeRO-1 share), all resident before the forward
pass; then the activations. `resident_bytes` is that first part, counted the
same way by the CPU emulation below and by `estimate_step_bytes` (`gpt2 plan`);
`steady_state` gives the micro-batch probe the real tensors on any device.

On CUDA the limit is the caching allocator's per-process fraction, so going
over it raises the real `torch.OutOfMemoryError`. A CPU has no such allocator
cap, so the limit is enforced by accounting: `resident_bytes` up front, plus
every tensor autograd saves for backward, counted as it is saved. With
recomputation (GPT.recompute) autograd saves only each block's input, and one
block's activations are rebuilt at a time during backward: that one block's
worth is measured on the first block and counted too. Crossing the limit raises
`torch.OutOfMemoryError` from inside the forward pass, which is where a GPU
would run out too. This lets the micro-batch search, its ZeRO-1 and
recomputation choices and the mid-run OOM error run for real on a CPU.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterable, Iterator

import torch

from gpt2.config.tree import Config

MB = 1 << 20


def set_cuda_limit(device: torch.device, limit_mb: int | None) -> None:
    """Cap this process's share of a GPU's memory (no-op without a limit)."""
    if limit_mb is None or device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mb * MB / total), device)


class _CpuAccount:
    """Running byte count of saved activations; each storage is counted once."""

    def __init__(self, limit: int, model: torch.nn.Module, state_bytes: int | None):
        self.limit, self.static = limit, static_bytes(model, state_bytes=state_bytes)
        self.saved, self.block_measured = 0, False
        # Weights saved for backward are already in `static`.
        self.seen = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def add(self, nbytes: int) -> None:
        self.saved += nbytes
        used = self.static + self.saved
        if used > self.limit:
            raise torch.OutOfMemoryError(
                f"CPU memory limit exceeded: {used / MB:.1f} MiB needed, "
                f"runtime.memory_limit_mb={self.limit / MB:.0f}"
            )

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in self.seen:
            self.seen.add(key)
            self.add(t.untyped_storage().nbytes())
        return t

    def measure_block(self, block: torch.nn.Module, x: torch.Tensor) -> None:
        """Count what one block saves when backward rebuilds it: run it once
        more, without recomputation, on a detached view of its input (which
        is kept anyway, as the block's checkpointed input)."""
        if self.block_measured:
            return
        self.block_measured = True  # before the call: it runs this hook again
        sizes: dict[int, int] = {}
        kept = self.seen | {x.untyped_storage().data_ptr()}

        def count(t: torch.Tensor) -> torch.Tensor:
            key = t.untyped_storage().data_ptr()
            if key not in kept:
                sizes[key] = t.untyped_storage().nbytes()
            return t

        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            block(x.detach().requires_grad_())
        self.add(sum(sizes.values()))


def resident_bytes(weight_bytes: float, owned_bytes: float, low_precision_copy_bytes: float = 0) -> float:
    """What a steady-state training step holds from before its forward pass to
    after its optimizer step: the weights (`weight_bytes`), as many bytes of
    gradients (DDP's buckets with gradient_as_bucket_view: no second copy),
    AdamW's exp_avg and exp_avg_sq of the parameters this rank steps
    (`owned_bytes` of them), and autocast's low-precision copy of the weights
    (on CUDA; a CPU run's casts are saved for backward and counted as saved)."""
    return 2 * weight_bytes + 2 * owned_bytes + low_precision_copy_bytes


def static_bytes(model: torch.nn.Module, optimizer_params: Iterable[torch.Tensor] | None = None,
                 state_bytes: int | None = None) -> int:
    """`resident_bytes` of `model`, with AdamW's moments for `optimizer_params`
    (this rank's share under ZeRO-1; default all), or `state_bytes` of
    optimizer state when given (gpt2.train.optim.state_bytes: Muon keeps one
    buffer a matrix, not two)."""
    params = list(model.parameters())
    if state_bytes is None:
        owned = params if optimizer_params is None else list(optimizer_params)
        state_bytes = 2 * sum(p.numel() * p.element_size() for p in owned)
    return int(resident_bytes(sum(p.numel() * p.element_size() for p in params), 0) + state_bytes)


@contextlib.contextmanager
def cpu_limit(model: torch.nn.Module, device: torch.device, limit_mb: int | None,
              state_bytes: int | None = None) -> Iterator[None]:
    """Enforce `limit_mb` on a CPU forward/backward (no-op on other devices or
    without a limit). Wrap the forward pass: backward frees what it used.
    `state_bytes`: the optimizer state this rank keeps (gpt2.train.optim.state_bytes;
    None: AdamW's two moments of every parameter)."""
    if limit_mb is None or device.type != "cpu":
        yield
        return
    account = _CpuAccount(limit_mb * MB, model, state_bytes)
    if account.static > account.limit:
        raise torch.OutOfMemoryError(
            f"CPU memory limit exceeded by the model alone: {account.static / MB:.1f} MiB for weights, "
            f"gradients and optimizer state, runtime.memory_limit_mb={limit_mb}"
        )
    with contextlib.ExitStack() as stack:
        blocks = getattr(getattr(model, "transformer", None), "h", None)
        if getattr(model, "recompute", False) and blocks:
            handle = blocks[0].register_forward_pre_hook(lambda block, args: account.measure_block(block, args[0]))
            stack.callback(handle.remove)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(account.pack, lambda t: t))
        yield


class GradientBuckets:
    """DDP's gradient buffers, for a probe that runs without DDP (each rank
    alone, no collectives): one flat buffer per dtype the size of all the
    gradients, resident for the whole step, every gradient moved into its
    slice as soon as backward has accumulated it, and left there. That is what
    DDP with gradient_as_bucket_view=True does (gpt2.train.parallel): its
    buckets are the gradients, and zero_grad(set_to_none) frees only the alias."""

    def __init__(self, params: Iterable[torch.Tensor]):
        params = [p for p in params if p.requires_grad]
        self.buffers = {dtype: torch.zeros(sum(p.numel() for p in params if p.dtype == dtype), dtype=dtype,
                                           device=params[0].device)
                        for dtype in {p.dtype for p in params}}
        offsets = dict.fromkeys(self.buffers, 0)
        self.views: dict[torch.Tensor, torch.Tensor] = {}
        for p in params:
            start = offsets[p.dtype]
            offsets[p.dtype] += p.numel()
            self.views[p] = self.buffers[p.dtype][start:start + p.numel()].view_as(p)
        self.handles = [p.register_post_accumulate_grad_hook(self._into_bucket) for p in params]

    def _into_bucket(self, p: torch.Tensor) -> None:
        view = self.views[p]
        if p.grad.data_ptr() != view.data_ptr():  # a fresh gradient: copy it in, free it
            p.grad = view.copy_(p.grad)

    def as_grads(self) -> None:
        """Every gradient set to its (zeroed) slice."""
        for p, view in self.views.items():
            p.grad = view.zero_()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for p in self.views:
            p.grad = None
        self.views, self.buffers = {}, {}


def settle(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's state as it is from step 2 on, by AdamW itself (its
    dtypes, its devices): one step over zero gradients (existing ones are
    zeroed). It moves the weights by weight decay only; the probe puts them back."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def steady_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ddp: bool) -> Iterator[None]:
    """The memory a training step runs in from step 2 on, for real: DDP's
    gradient buckets (`ddp`: training wraps the model in DDP) and AdamW's
    moments exist before the forward pass. A probe that allocated the moments
    only at its optimizer step, after the activations were freed, and had no
    buckets would see ~12 bytes a parameter less than training needs."""
    buckets = GradientBuckets(model.parameters()) if ddp else None
    try:
        if buckets is not None:
            buckets.as_grads()  # the zero step's gradients: no transient copy
        settle(optimizer)
        yield
    finally:
        optimizer.zero_grad(set_to_none=True)
        if buckets is not None:
            buckets.remove()


NCCL_RESERVE_BYTES = 512 * MB
"""What NCCL's communicators hold on each GPU of a multi-rank run beside the
step (channels × buffers per peer; a few hundred MB on 8 GPUs): the probe
keeps this much aside, and `gpt2 plan` counts it."""


@contextlib.contextmanager
def communication_reserve(device: torch.device, world_size: int) -> Iterator[None]:
    """Hold NCCL's share of a GPU during the micro-batch probe (CUDA, several ranks)."""
    held = torch.empty(NCCL_RESERVE_BYTES, dtype=torch.uint8, device=device) \
        if device.type == "cuda" and world_size > 1 else None
    try:
        yield
    finally:
        del held


def release(device: torch.device) -> None:
    """Give freed blocks back after an OOM so the next, smaller try starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def probe_limit_mb(device: torch.device, limit_mb: int | None) -> int | None:
    """The limit for the micro-batch search. Without one, a CPU search is capped
    at 80% of the memory available now: trying a size that exceeds RAM would
    swap or get the process killed instead of raising an OOM."""
    if limit_mb is not None or device.type != "cpu":
        return limit_mb
    import psutil

    return int(psutil.virtual_memory().available * 0.8) // MB


# Bytes per token per channel and block that an eager bf16-autocast training
# step keeps for backward (flash attention, so nothing grows with T²): the fp32
# inputs of both LayerNorms (4 + 4), the bf16 inputs of the attention and MLP
# input projections (2 + 2), q/k/v (6), the attention output and its contiguous
# copy (2 + 2), the MLP's pre-GELU (8) and post-GELU (8) activations; once per
# token, the final LayerNorm's fp32 input and the head's bf16 input (4 + 2).
ACTIVATION_BYTES_PER_CHANNEL = 38
# Per token and vocabulary entry at the loss: bf16 logits, their fp32 copy,
# log-softmax's fp32 output, and its gradient during backward.
LOGIT_BYTES_PER_ENTRY = 12
# Per parameter: fp32 weights and gradients plus autocast's bf16 copy of the
# weights; AdamW's two fp32 moments (as in static_bytes) are counted apart,
# since ZeRO-1 splits them across ranks.
STATIC_BYTES_PER_PARAM = 4 + 4 + 2
ADAMW_BYTES_PER_PARAM = 4 + 4
# Per token and channel and block under recomputation: the block's fp32 input,
# the one tensor a checkpointed block keeps for backward.
RECOMPUTE_BYTES_PER_CHANNEL = 4
SCALER_BYTES, FP32_ACTIVATION_BYTES_PER_CHANNEL = 3 * 4, 68  # fp16: bf16's + the scaler's 3 scalars; fp32: 4 B
FRAGMENTATION = 1.1  # the caching allocator's slack over the tensors it holds
RESERVED_BYTES = 1 << 30  # CUDA context, cuBLAS workspaces


def estimate_step_bytes(n_params: int, n_layer: int, n_embd: int, vocab_size: int, tokens: int,
                        optimizer_shards: int = 1, recompute: bool = False, optimizer: str = "adamw",
                        precision: str = "bf16") -> int:
    """Estimated peak GPU memory of one eager training step (forward, backward, AdamW) over `tokens` =
    micro-batch × block_size tokens in `precision` (bf16, fp16, fp32: gpt2.train.precision): what the
    micro-batch search (gpt2.train.step.find_micro_batch) would find fits. `optimizer_shards`: ranks
    AdamW's state is split over (ZeRO-1; 1: not split). `recompute`: the blocks keep only their inputs,
    and backward rebuilds one block's activations at a time. `optimizer`: with `muon` the blocks'
    matrices (12 n_embd² a block) keep one buffer, not two moments. For planning; the search runs steps."""
    fp32 = precision == "fp32"
    activations = FP32_ACTIVATION_BYTES_PER_CHANNEL if fp32 else ACTIVATION_BYTES_PER_CHANNEL
    blocks = RECOMPUTE_BYTES_PER_CHANNEL * n_layer + activations if recompute else activations * n_layer
    per_token = (blocks + (8 if fp32 else 6)) * n_embd + LOGIT_BYTES_PER_ENTRY * vocab_size
    # fp32 weights and moments, autocast's bf16 copy: STATIC_BYTES_PER_PARAM + ADAMW_BYTES_PER_PARAM a parameter.
    static = resident_bytes(4 * n_params, 4 * n_params / optimizer_shards, 0 if fp32 else 2 * n_params) + (
        SCALER_BYTES if precision == "fp16" else 0)
    if optimizer == "muon":  # one fp32 buffer instead of two moments for each matrix
        static -= 4 * 12 * n_embd * n_embd * n_layer / optimizer_shards
    return int(RESERVED_BYTES + static + FRAGMENTATION * per_token * tokens)


def estimate_multi_rank_bytes(ranks: int) -> int:
    """What `estimate_step_bytes` leaves out with several ranks: NCCL's buffers."""
    return NCCL_RESERVE_BYTES if ranks > 1 else 0


def oom_message(config: Config, micro_batch: int, device: torch.device, step: int, err: Exception) -> str:
    """What to change after an out-of-memory error at `step`: the micro-batch, never the global batch."""
    limit = config.runtime.memory_limit_mb
    where = f"runtime.memory_limit_mb={limit}" if limit else str(device)
    return (f"out of memory at step {step} with micro-batch {micro_batch} x {config.model.block_size} "
            f"tokens ({where}): set a smaller train.micro_batch_size (or train.micro_batch_size=auto); "
            f"the global batch stays train.total_batch_tokens. ({str(err).splitlines()[0][:200]})")
