"""bench.train_step's record for `bench/results.jsonl`: its device, its
throughput eager and compiled, and MFU. Where the records live, their
provenance (commit, date) and adding one are the product's
(gpt2.report.figures_on_record), which `gpt2 plan` and `gpt2 preflight` read and
write too; every benchmark's `--record` goes through it.
"""

from __future__ import annotations

from datetime import datetime, timezone

import torch

from gpt2.report.figures_on_record import commit

TRAIN_STEP_KEYS = ("date", "commit", "device", "torch", "bench", "micro_batch", "tok_s_eager", "tok_s_compiled",
                   "compiled_over_eager", "mfu", "gpus")


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def train_step_record(device: torch.device, gpus: int, micro_batch: int, tok_s_eager: float | None,
                      tok_s_compiled: float | None, mfu: float | None, revision: str | None = None) -> dict:
    """One run of bench.train_step as a record: global tokens/s eager and
    compiled (None: not measured), their ratio, MFU as a fraction of the
    dense bf16 peak per GPU (of the compiled step when measured, else eager)."""
    ratio = tok_s_compiled / tok_s_eager if tok_s_eager and tok_s_compiled else None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": revision or commit(),
        "device": device_name(device),
        "torch": torch.__version__,
        "bench": "train_step",
        "micro_batch": micro_batch,
        "tok_s_eager": tok_s_eager,
        "tok_s_compiled": tok_s_compiled,
        "compiled_over_eager": ratio,
        "mfu": mfu,
        "gpus": gpus,
    }
