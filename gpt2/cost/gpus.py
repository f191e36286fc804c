"""The GPUs `gpt2 plan` knows, by name or by a CUDA device's name: each one's dense bf16 peak (None
for the cards without native bf16: T4, V100, P100), its dense fp16 peak and its memory
(gpt2.train.throughput's tables), and the precision train.precision=auto trains in there. Read by
the plan, by what it knows from measurements (gpt2.cost.measured) and by the preflight."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2.errors import UserError
from gpt2.train.throughput import GPU_MEMORY_GIB, fp16_peak_of, peak_flops_of


class PlanError(UserError, ValueError):
    """An unknown GPU or an impossible shape; the message says what is accepted."""


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float | None
    """Dense bf16 FLOP/s; None on a card without native bf16."""
    memory_gib: float
    peak_fp16_flops: float | None = None
    """Dense fp16 FLOP/s (fp32 accumulation)."""

    @property
    def precision(self) -> str:
        """What train.precision=auto trains in on this card (gpt2.train.precision)."""
        return "bf16" if self.peak_flops is not None else "fp16"

    def peak_for(self, precision: str) -> float:
        """The peak the time estimate uses for a run in `precision` (bf16, else fp16)."""
        if precision == "bf16" and self.peak_flops is not None:
            return self.peak_flops
        return self.peak_fp16_flops or self.peak_flops


def _key(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def gpu(name: str) -> Gpu:
    """A GPU by name (case, spaces and dashes ignored: `a100-40gb`, `RTX4090`, `t4`)."""
    known = {_key(k): k for k in GPU_MEMORY_GIB}
    canonical = known.get(_key(name))
    peak = peak_flops_of(canonical) if canonical else None
    fp16 = fp16_peak_of(canonical) if canonical else None
    if canonical is None or (peak is None and fp16 is None):
        raise PlanError(f"unknown GPU {name!r}; known: {', '.join(GPU_MEMORY_GIB)}")
    return Gpu(canonical, peak, GPU_MEMORY_GIB[canonical], fp16)


def _parts_in(known: str, device_key: str) -> bool:
    """Each dash-separated part of a known name is in the device's name: "V100-32GB"
    is a "Tesla V100-SXM2-32GB", where "V10032GB" as one piece is not."""
    return all(_key(part) in device_key for part in known.split("-"))


def gpu_of_device(device_name: str) -> Gpu | None:
    """The plan's GPU for a CUDA device name ("NVIDIA H100 80GB HBM3" is an
    H100): the most specific (longest) known name it contains; None when none."""
    key = _key(device_name)
    found = [k for k in GPU_MEMORY_GIB if _key(k) in key or ("-" in k and _parts_in(k, key))]
    return gpu(max(found, key=lambda k: len(_key(k)))) if found else None
