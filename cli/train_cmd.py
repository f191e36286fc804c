"""`gpt2 train`: run the training stage on the data `gpt2 prepare` made.

    gpt2 train --preset smoke --json
    gpt2 train --preset gpt2-124m --root gs://bucket/gpt2 --set runtime.nproc_per_node=8
"""

from __future__ import annotations

import shlex
from typing import Optional

import typer

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt, emit, fail, load_config, run_flow, setup_logging

FreshOpt = typer.Option(False, "--fresh", help="Delete this run's checkpoints and start over (default: resume).")


def _prepare_hint(preset: str, sets: Optional[list[str]], root: Optional[str]) -> str:
    parts = ["gpt2", "prepare", "--preset", preset]
    for s in sets or []:
        parts += ["--set", s]
    if root:
        parts += ["--root", root]
    return " ".join(shlex.quote(p) for p in parts)


def train(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    fresh: bool = FreshOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Train GPT-2 on the prepared shards; rerun the same command to resume."""
    config = load_config(preset, sets, root)
    setup_logging()
    from gpt2 import layout, storage

    url = layout.manifest(config)
    if not storage.exists(url):
        fail(f"no prepared data for this config: {url} does not exist; make it first with:\n  "
             + _prepare_hint(preset, sets, root))
    _, result = run_flow("flows.train:train_flow", preset, sets, root, fresh=fresh)
    val = result["final_val_loss"]
    summary = f"{'cached' if result.get('cached') else 'trained'}: {result['run_name']} at step {result['steps']}"
    if val is not None:
        summary += f", val loss {val:.4f}"
    emit(result, as_json, f"{summary}\ncheckpoint: {result['checkpoint']}")
