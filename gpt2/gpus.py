"""The GPUs `gpt2 plan` knows, by name or by a CUDA device's name: each one's dense bf16 peak and
memory (gpt2.train.throughput's tables). Read by the plan, by what it knows from measurements
(gpt2.plan_measured) and by the preflight."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2.errors import UserError
from gpt2.train.throughput import GPU_MEMORY_GIB, peak_flops_of


class PlanError(UserError, ValueError):
    """An unknown GPU or an impossible shape; the message says what is accepted."""


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float
    memory_gib: float


def _key(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def gpu(name: str) -> Gpu:
    """A GPU by name (case, spaces and dashes ignored: `a100-40gb`, `RTX4090`)."""
    known = {_key(k): k for k in GPU_MEMORY_GIB}
    canonical = known.get(_key(name))
    peak = peak_flops_of(canonical) if canonical else None
    if canonical is None or peak is None:
        raise PlanError(f"unknown GPU {name!r}; known: {', '.join(GPU_MEMORY_GIB)}")
    return Gpu(canonical, peak, GPU_MEMORY_GIB[canonical])


def gpu_of_device(device_name: str) -> Gpu | None:
    """The plan's GPU for a CUDA device name ("NVIDIA H100 80GB HBM3" is an
    H100): the most specific (longest) known name it contains; None when none."""
    key = _key(device_name)
    found = [k for k in GPU_MEMORY_GIB if _key(k) in key]
    return gpu(max(found, key=lambda k: len(_key(k)))) if found else None
