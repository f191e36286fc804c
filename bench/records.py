"""GPU figures on record: `bench/results.jsonl`, one JSON object per measured
run, each with the commit and device it came from, so a figure can always be
traced to the code that produced it (modded-nanogpt's record table, llm.c's
README). Only GPU runs are recorded; CPU runs print their figures and stop.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch

RESULTS = Path(__file__).with_name("results.jsonl")
TRAIN_STEP_KEYS = ("date", "commit", "device", "torch", "bench", "micro_batch", "tok_s_eager", "tok_s_compiled",
                   "compiled_over_eager", "mfu", "gpus")


def commit(repo: Path = Path(__file__).parent) -> str:
    """The checked-out commit, `+dirty` when tracked files differ from it (the
    figure then came from code no commit holds), `unknown` outside git.
    $BENCH_COMMIT names it where the tree travelled without its .git (a
    GPU machine that receives a copy of the checkout)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


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


def figures_record(bench: str, device: str, torch_version: str, figures: dict, revision: str | None = None,
                   date: str | None = None) -> dict:
    """A GPU check's figures other than bench.train_step's (a resume compared
    with an uninterrupted run, the micro-batch `auto` picks, a compile cache's
    warm start, a checkpoint's snapshot): the same provenance keys first, then
    the check's own figures under `figures`."""
    return {
        "date": date or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": revision or commit(),
        "device": device,
        "torch": torch_version,
        "bench": bench,
        "figures": figures,
    }


def append(record: dict, path: Path = RESULTS) -> Path:
    """Add `record` as one line of `path` (created when missing)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    return path
