"""`gpt2 prepare`: run the data stage (download → tokenize → shard → upload)."""

from __future__ import annotations

from typing import Optional

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt, emit, fail, load_config, prefect_env, setup_logging


def prepare(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Tokenize the corpus into llm.c shards under the artifact root (cached: a
    rerun skips finished work, a killed run continues where it stopped)."""
    config = load_config(preset, sets, root)
    setup_logging()
    prefect_env()
    from flows.data import data_flow
    from gpt2.data.prepare import EmptyCorpusError
    from gpt2.data.shards import ShardError
    from gpt2.data.sources import SourceError
    from gpt2.storage import StorageError

    from gpt2.overrides import parse_assignments

    overrides, _ = parse_assignments(sets or [])
    try:
        result = data_flow(preset=preset, overrides=overrides, root=config.runtime.root)
    except (SourceError, EmptyCorpusError, ShardError, StorageError, FileNotFoundError) as err:
        fail(str(err))
    emit(
        result,
        as_json,
        f"{'cached' if result['cached'] else 'prepared'}: {result['shards']} shards, "
        f"{result['train_tokens']:,} train + {result['val_tokens']:,} val tokens\nmanifest: {result['manifest']}",
    )

