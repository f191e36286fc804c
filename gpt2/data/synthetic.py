"""A prepared root made of given tokens, where the data stage would write it
(shards and manifest at the config's data directory): for the benchmarks and
tests that train without a corpus (`python -m bench.restart`)."""

from __future__ import annotations

import io
from typing import Iterable

import numpy as np

from gpt2.config.identity import data_fingerprint
from gpt2.config.tree import Config
from gpt2.data.llmc import write_shard
from gpt2.data.manifest import Manifest, ShardEntry
from gpt2.root import layout, storage


def write_dataset(config: Config, shards: Iterable[tuple[str, np.ndarray]], source: dict) -> str:
    """Write each (split, uint16 tokens) as a shard, then the manifest naming
    `source`; returns the manifest's URL."""
    directory, entries = layout.data_dir(config), []
    for i, (split, tokens) in enumerate(shards):
        buf = io.BytesIO()
        sha = write_shard(buf, tokens)
        name = f"{config.data.name}_{split}_{i:06d}.bin"
        storage.write_bytes_atomic(storage.join(directory, name), buf.getvalue())
        entries.append(ShardEntry(path=name, split=split, tokens=len(tokens), bytes=len(buf.getvalue()), sha256=sha))
    fingerprint = data_fingerprint(config)
    manifest = Manifest(name=f"{config.data.name}-{fingerprint[:12]}", fingerprint=fingerprint,
                        tokenizer={"name": "gpt2"}, source=source, data_config=config.data.model_dump(mode="json"),
                        shards=entries)
    storage.write_json_atomic(layout.manifest(config), manifest.model_dump(mode="json"))
    return layout.manifest(config)


def random_tokens(n: int, seed: int = 0, vocab: int = 50257) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.uint16)
