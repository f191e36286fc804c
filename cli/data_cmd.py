"""`gpt2 prepare`: run the data stage (download → tokenize → shard → upload)."""

from __future__ import annotations

from typing import Optional

import typer

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt, emit, load_config, setup_logging


def prepare(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Tokenize the corpus into llm.c shards under the artifact root (cached)."""
    config = load_config(preset, sets, root)
    setup_logging()
    raise NotImplementedError  # filled in with the data flow
