"""Device memory limits: `runtime.memory_limit_mb` and what counts as an OOM.

On CUDA the limit is the caching allocator's per-process fraction, so going
over it raises the real `torch.OutOfMemoryError`. A CPU has no such allocator
cap, so the limit is enforced by accounting: parameters, their gradients and
AdamW's two moment buffers (4 × parameter bytes, counted up front because the
optimizer step will need them) plus every tensor autograd saves for backward,
counted as it is saved. Crossing the limit raises `torch.OutOfMemoryError`
from inside the forward pass, which is where a GPU would run out too. This
lets the micro-batch search and the mid-run OOM error run for real on a CPU.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

import torch

MB = 1 << 20


def set_cuda_limit(device: torch.device, limit_mb: int | None) -> None:
    """Cap this process's share of a GPU's memory (no-op without a limit)."""
    if limit_mb is None or device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mb * MB / total), device)


class _CpuAccount:
    """Running byte count of saved activations; each storage is counted once."""

    def __init__(self, limit: int, model: torch.nn.Module):
        self.limit, self.static = limit, static_bytes(model)
        self.saved = 0
        # Weights saved for backward are already in `static`.
        self.seen = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in self.seen:
            self.seen.add(key)
            self.saved += storage.nbytes()
            used = self.static + self.saved
            if used > self.limit:
                raise torch.OutOfMemoryError(
                    f"CPU memory limit exceeded: {used / MB:.1f} MiB needed, "
                    f"runtime.memory_limit_mb={self.limit / MB:.0f}"
                )
        return t


def static_bytes(model: torch.nn.Module) -> int:
    """Parameters + gradients + AdamW's exp_avg and exp_avg_sq."""
    return 4 * sum(p.numel() * p.element_size() for p in model.parameters())


@contextlib.contextmanager
def cpu_limit(model: torch.nn.Module, device: torch.device, limit_mb: int | None) -> Iterator[None]:
    """Enforce `limit_mb` on a CPU forward/backward (no-op on other devices or
    without a limit). Wrap the forward pass: backward frees what it used."""
    if limit_mb is None or device.type != "cpu":
        yield
        return
    account = _CpuAccount(limit_mb * MB, model)
    if account.static > account.limit:
        raise torch.OutOfMemoryError(
            f"CPU memory limit exceeded by the model alone: {account.static / MB:.1f} MiB for weights, "
            f"gradients and optimizer state, runtime.memory_limit_mb={limit_mb}"
        )
    with torch.autograd.graph.saved_tensors_hooks(account.pack, lambda t: t):
        yield


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
# Per parameter: fp32 weights, gradients and AdamW's two moments (as in
# static_bytes), plus autocast's bf16 copy of the weights.
STATIC_BYTES_PER_PARAM = 4 * 4 + 2
FRAGMENTATION = 1.1  # the caching allocator's slack over the tensors it holds
RESERVED_BYTES = 1 << 30  # CUDA context, cuBLAS workspaces


def estimate_step_bytes(n_params: int, n_layer: int, n_embd: int, vocab_size: int, tokens: int) -> int:
    """Estimated peak GPU memory of one eager bf16 training step (forward,
    backward, AdamW) over `tokens` = micro-batch × block_size tokens: what the
    micro-batch search (gpt2.train.step.find_micro_batch) would find fits.
    An estimate for planning only; the search itself runs real steps."""
    per_token = (ACTIVATION_BYTES_PER_CHANNEL * n_layer + 6) * n_embd + LOGIT_BYTES_PER_ENTRY * vocab_size
    return int(RESERVED_BYTES + STATIC_BYTES_PER_PARAM * n_params + FRAGMENTATION * per_token * tokens)
