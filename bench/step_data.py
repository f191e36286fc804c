"""Batches for the step benchmark through the trainer's own data path: one
synthetic llm.c shard on local disk, memory-mapped and verified by
ShardSource, cut by TrainLoader into this rank's micro-batches in host memory
(pinned on CUDA). A timed iteration that calls `next_batches()` therefore
includes the batch fetch exactly as a training step does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpt2.data.llmc import write_shard
from gpt2.data.loader import TrainLoader
from gpt2.data.manifest import Manifest, ShardEntry
from gpt2.data.shard_source import ShardSource
from gpt2.process.distributed import DistEnv

WINDOWS = 4  # global batches in the shard before the loader wraps around to its start
VOCAB = 50257


def synthetic_loader(directory: Path, seq_len: int, micro_batch: int, accum: int, env: DistEnv) -> TrainLoader:
    """A TrainLoader over a shard of random tokens written under `directory`
    (once; every rank writes its own directory, so no rank waits for another).
    Each step takes `micro_batch` × `accum` sequences of `seq_len` tokens per rank."""
    total_batch_tokens = micro_batch * accum * seq_len * env.world_size
    path = directory / "bench_train_000000.bin"
    tokens = WINDOWS * total_batch_tokens + 1
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        data = np.random.default_rng(0).integers(0, VOCAB, size=tokens, dtype=np.uint16)
        with open(path, "wb") as f:
            sha = write_shard(f, data)
        (directory / "sha256").write_text(sha)
    entry = ShardEntry(path=path.name, split="train", tokens=tokens, bytes=path.stat().st_size,
                       sha256=(directory / "sha256").read_text())
    manifest = Manifest(name="bench", fingerprint="bench", tokenizer={"name": "gpt2"},
                        source={"kind": "random"}, data_config={}, shards=[entry])
    source = ShardSource((directory / "manifest.json").as_uri(), manifest, directory / "cache", env)
    return TrainLoader(source, seq_len, total_batch_tokens, micro_batch, env)
