"""What `gpt2 plan` knows from measurements: the newest MFU measured on the
chosen GPU for the preset's model, from the GPU records in
`bench/results.jsonl` (gpt2.report.figures_on_record: the preflight's throughput of
that preset, or bench.train_step's compiled step, which is GPT-2 124M).
$GPT2_BENCH_RESULTS names another records file; without a record the plan
keeps its assumption and says so."""

from __future__ import annotations

from gpt2.cost.gpus import Gpu, gpu_of_device
from gpt2.report.figures_on_record import read, results_path


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
    path = results_path()
    found = []
    for record in read(path):
        known = gpu_of_device(str(record.get("device", "")))
        mfu = _mfu_of(record, preset)
        if known is not None and known.name == gpu.name and isinstance(mfu, (int, float)) and 0 < mfu <= 1:
            found.append((str(record.get("date", "")), float(mfu), record))
    if not found:
        return None
    date, mfu, record = max(found, key=lambda f: f[0])
    return mfu, (f"measured: {record['bench']} of {preset} on one {record['device']}, {date[:10]}, commit "
                 f"{str(record.get('commit', 'unknown'))[:7]} ({path.name})")
