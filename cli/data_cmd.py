"""`gpt2 prepare`: run the data stage (download → tokenize → shard → upload)."""

from __future__ import annotations

from typing import Optional

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt, emit, run_flow


def prepare(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Tokenize the corpus into llm.c shards under the artifact root (cached: a
    rerun skips finished work, a killed run continues where it stopped)."""
    _, result = run_flow("flows.data:data_flow", preset, sets, root)
    emit(
        result,
        as_json,
        f"{'cached' if result['cached'] else 'prepared'}: {result['shards']} shards, "
        f"{result['train_tokens']:,} train + {result['val_tokens']:,} val tokens\nmanifest: {result['manifest']}",
    )

