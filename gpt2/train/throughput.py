"""Tokens per second and model FLOPs utilization (MFU).

MFU = achieved model FLOPs / the device's peak dense bf16 FLOPs (the
convention of PaLM, nanoGPT and llm.c), or its fp16 peak for a run in fp16
(train.precision; the GPUs without bf16 have only that one). Peaks come from
the vendors' data sheets; devices not in the tables (and CPUs) report
tokens/s only.
"""

from __future__ import annotations

import time

import torch

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s, by a part of the CUDA
# device name. The longest key found in a name wins (peak_flops_of), whatever
# the order here: "NVIDIA H200 NVL" is an H200 NVL, not an H200 SXM.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
)


# Dense fp16 peaks (fp32 accumulation) in FLOP/s of the GPUs without native
# bf16, matched as above: the tensor cores of Turing (T4) and Volta (V100, SXM2;
# the PCIe card's is 112), the plain fp16 units of Pascal (P100 PCIe, the
# Kaggle card). From Ampere on, fp16 runs at the bf16 peak (fp16_peak_of).
PEAK_FP16_FLOPS: tuple[tuple[str, float], ...] = (
    ("T4", 65e12),
    ("V100", 125e12),
    ("V100-PCIE", 112e12),
    ("P100", 18.7e12),
)


# Memory in GiB of the GPUs `gpt2 plan` knows, by the name it accepts (the
# peak comes from the tables above, matched the same way as a device name).
# The 16 GB cards count what torch reports of them (total_memory), which is
# what the micro-batch has to fit in: a T4 shows 14.6 GiB, not 16.
GPU_MEMORY_GIB: dict[str, float] = {
    "H100": 80, "H100 PCIe": 80, "H100 NVL": 94, "H200": 141, "H200 NVL": 141, "H800": 80, "GH200": 96, "B200": 180,
    "A100": 80, "A100-80GB": 80, "A100-40GB": 40, "A800": 80,
    "L40S": 48, "L40": 48, "L4": 24, "A10G": 24, "A10": 24, "RTX 4090": 24, "RTX 3090": 24,
    "T4": 14.6, "P100": 15.9, "V100-16GB": 15.8, "V100-32GB": 31.7,  # a plain "V100" is either: named by its memory
}


def peak_flops_of(name: str) -> float | None:
    """Peak bf16 FLOP/s for a GPU or CUDA device name: the most specific
    (longest) table key it contains; None when it contains none."""
    found = [(len(key), flops) for key, flops in PEAK_BF16_FLOPS if key in name]
    return max(found)[1] if found else None


def fp16_peak_of(name: str) -> float | None:
    """Peak fp16 FLOP/s for a GPU or CUDA device name: the fp16 table's most
    specific key it contains, else (Ampere and later) its bf16 peak."""
    key = name.upper().replace(" ", "-")
    found = [(len(k), flops) for k, flops in PEAK_FP16_FLOPS if k.upper() in key]
    return max(found)[1] if found else peak_flops_of(name)


def peak_flops(device: torch.device, precision: str = "bf16") -> float | None:
    """The device's peak FLOP/s in `precision` (bf16; fp16 for an fp16 run, and
    fp32 runs are measured against it too), or None when unknown (CPU, MPS, new GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return peak_flops_of(name) if precision == "bf16" else fp16_peak_of(name)


def mfu(flops_per_token: float, tokens_per_second_per_device: float, peak: float | None) -> float | None:
    """Fraction of peak used by the model's training FLOPs (None without a peak)."""
    if peak is None:
        return None
    return flops_per_token * tokens_per_second_per_device / peak


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so a wall-clock interval measures the step itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Throughput:
    """Running tokens/s over timed steps; the first step (warm-up, compilation)
    of each session is left out of the average when there are others."""

    def __init__(self) -> None:
        self.tokens = 0
        self.seconds = 0.0
        self.first: tuple[int, float] | None = None

    def add(self, tokens: int, seconds: float) -> None:
        if self.first is None:
            self.first = (tokens, seconds)
            return
        self.tokens += tokens
        self.seconds += seconds

    @property
    def tokens_per_second(self) -> float:
        if self.seconds > 0:
            return self.tokens / self.seconds
        if self.first is not None and self.first[1] > 0:
            return self.first[0] / self.first[1]
        return 0.0


def now() -> float:
    return time.perf_counter()
