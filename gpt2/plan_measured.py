"""What `gpt2 plan` knows from measurements: the newest MFU measured on the
chosen GPU for the preset's model, from the GPU records in
`bench/results.jsonl` (the preflight's throughput of that preset, or
bench.train_step's compiled step, which is GPT-2 124M). $GPT2_BENCH_RESULTS
names another records file; without a record the plan keeps its assumption
and says so."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpt2.gpus import Gpu, gpu_of_device

RESULTS_ENV = "GPT2_BENCH_RESULTS"
RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results.jsonl"


def _records(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:  # an installed package without the checkout's records
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _mfu_of(record: dict, preset: str) -> float | None:
    """A record's MFU for `preset`'s model: the preflight of that preset, or the
    one-GPU compiled step of bench.train_step (GPT-2 124M)."""
    figures = record.get("figures") or {}
    if record.get("bench") == "preflight" and figures.get("preset") == preset:
        return figures.get("mfu")
    if record.get("bench") == "train_step" and preset == "gpt2-124m" and record.get("gpus") == 1 \
            and record.get("tok_s_compiled"):
        return record.get("mfu")
    return None


SAME_STEP = {"gpt2-124m-owt": "gpt2-124m"}
"""Presets whose training step is another's (same model, batch and optimizer; only
the data differs, which does not change the speed): that one's measurements hold."""


def measured_mfu(gpu: Gpu, preset: str) -> tuple[float, str] | None:
    """(MFU, where it was measured) of the newest matching record, or None."""
    preset = SAME_STEP.get(preset, preset)
    path = Path(os.environ.get(RESULTS_ENV) or RESULTS)
    found = []
    for record in _records(path):
        known = gpu_of_device(str(record.get("device", "")))
        mfu = _mfu_of(record, preset)
        if known is not None and known.name == gpu.name and isinstance(mfu, (int, float)) and 0 < mfu <= 1:
            found.append((str(record.get("date", "")), float(mfu), record))
    if not found:
        return None
    date, mfu, record = max(found, key=lambda f: f[0])
    return mfu, (f"measured: {record['bench']} of {preset} on one {record['device']}, {date[:10]}, commit "
                 f"{str(record.get('commit', 'unknown'))[:7]} ({path.name})")
