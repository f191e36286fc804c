"""GPU figures on record: `bench/results.jsonl` in the checkout, one JSON
object per measured run, each with the commit and device it came from, so a
figure can always be traced to the code that produced it (modded-nanogpt's
record table, llm.c's README). Only GPU runs are recorded.

The product reads them (`gpt2 plan`'s measured MFU, gpt2.cost.measured) and
adds its own (`gpt2 preflight --record`); the benchmarks in bench/ add theirs
through here too (bench.records). $GPT2_BENCH_RESULTS names another file to
read; an installed package without the checkout reads none.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results.jsonl"
RESULTS_ENV = "GPT2_BENCH_RESULTS"


def results_path() -> Path:
    """The records file read: $GPT2_BENCH_RESULTS, else the checkout's."""
    return Path(os.environ.get(RESULTS_ENV) or RESULTS)


def read(path: Path) -> list[dict]:
    """Every record of `path` that parses as a JSON object (a torn line is skipped)."""
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


def figures_record(bench: str, device: str, torch_version: str, figures: dict, revision: str | None = None,
                   date: str | None = None) -> dict:
    """A GPU check's figures other than bench.train_step's (a preflight, a
    resume compared with an uninterrupted run, the micro-batch `auto` picks, a
    compile cache's warm start, a checkpoint's snapshot): the provenance keys
    first, then the check's own figures under `figures`."""
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
