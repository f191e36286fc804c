"""The training loader: deterministic, world-size independent, resumable, cached."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from gpt2.data.llmc import ShardError, write_shard
from gpt2.data.loader import TrainLoader, val_batches
from gpt2.data.manifest import load_manifest
from gpt2.data.shard_source import ShardSource
from gpt2.process.distributed import DistEnv
from gpt2.root import layout, storage
from tests.gpt2.train.fixtures import tiny_config, write_dataset

CPU = torch.device("cpu")


def env(rank=0, world=1) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world, device=CPU)


def loader(config, tmp_path, rank=0, world=1, micro=4, total=256) -> TrainLoader:
    url = layout.manifest(config)
    source = ShardSource(url, load_manifest(url), tmp_path / "cache", env(rank, world))
    return TrainLoader(source, config.model.block_size, total, micro, env(rank, world))


def global_batch(config, tmp_path, world, micro, steps):
    """Per step: all sequences (inputs, targets) of every rank, in rank order."""
    loaders = [loader(config, tmp_path, r, world, micro) for r in range(world)]
    out = []
    for _ in range(steps):
        parts = [b for ld in loaders for b in ld.next_batches()]
        out.append((torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])))
    return out


@pytest.fixture()
def data(tmp_path):
    config = tiny_config(tmp_path)
    write_dataset(config, train_shards=2, shard_tokens=1000, val_tokens=400)
    return config


def test_batches_are_next_token_pairs_with_llmc_layout(data, tmp_path):
    ld = loader(data, tmp_path)
    batches = ld.next_batches()
    assert ld.accumulation_steps == 2 and len(batches) == 2
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert x.shape == (8, 32)
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    tokens = torch.from_numpy(ld.source.tokens(ld.shards[0])[:257].astype(np.int64))
    torch.testing.assert_close(x.flatten(), tokens[:256])
    torch.testing.assert_close(y.flatten(), tokens[1:257])


def test_global_batch_is_the_same_for_any_world_size(data, tmp_path):
    one = global_batch(data, tmp_path, world=1, micro=4, steps=9)
    two = global_batch(data, tmp_path, world=2, micro=2, steps=9)
    four = global_batch(data, tmp_path, world=4, micro=1, steps=9)
    for a, b, c in zip(one, two, four):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)


def test_moves_through_shards_then_starts_a_new_epoch(data, tmp_path):
    ld = loader(data, tmp_path)
    seen = []
    for _ in range(7):
        seen.append(dict(ld.state_dict()))
        ld.next_batches()
    # 1000-token shards hold three 257-token windows each; then the next epoch.
    assert [(p["shard"], p["offset"], p["epoch"]) for p in seen] == [
        (0, 0, 0), (0, 256, 0), (0, 512, 0), (1, 0, 0), (1, 256, 0), (1, 512, 0), (0, 0, 1)]


def test_position_round_trips_through_a_checkpoint(data, tmp_path):
    reference = loader(data, tmp_path)
    for _ in range(4):
        reference.next_batches()
    state = reference.state_dict()
    expected = reference.next_batches()
    resumed = loader(data, tmp_path, rank=1, world=2, micro=2)
    resumed.load_state_dict(state)
    other = loader(data, tmp_path, rank=0, world=2, micro=2)
    other.load_state_dict(state)
    got = other.next_batches() + resumed.next_batches()
    torch.testing.assert_close(torch.cat([x for x, _ in got]), torch.cat([x for x, _ in expected]))


def test_validation_set_does_not_depend_on_world_size(data, tmp_path):
    url = layout.manifest(data)
    manifest = load_manifest(url)

    def sequences(world, micro):
        rows = []
        for r in range(world):
            src = ShardSource(url, manifest, tmp_path / "c", env(r, world))
            rows += [x for b in val_batches(src, 32, 1000, micro, env(r, world)) for x in b[0]]
        return sorted(tuple(r.tolist()) for r in rows)

    one = sequences(1, 4)
    assert len(one) == (400 - 1) // 32  # the val split caps the requested 1000 tokens
    assert one == sequences(2, 3) == sequences(3, 1)


def test_remote_shards_are_cached_and_verified(tmp_path):
    config = tiny_config("memory://loader-test")
    url = write_dataset(config, train_shards=1, shard_tokens=1000, val_tokens=400)
    ld = loader(config, tmp_path)
    ld.next_batches()
    cached = list((tmp_path / "cache").rglob("*.bin"))
    assert len(cached) == 1 and cached[0].stat().st_size == 1024 + 2 * 1000

    # Same size, other bytes: only the sha256 can tell; the error names the shard.
    entry = load_manifest(url).split("train")[0]
    buf = io.BytesIO()
    write_shard(buf, np.zeros(1000, dtype=np.uint16))
    storage.write_bytes_atomic(layout.shard(url, entry.path), buf.getvalue())
    cached[0].unlink()
    with pytest.raises(ShardError, match=entry.path):
        loader(config, tmp_path).next_batches()
    assert not cached[0].exists()
    storage.remove("memory://loader-test", recursive=True)


def test_shards_smaller_than_a_global_batch_are_an_error_naming_the_setting(data, tmp_path):
    with pytest.raises(ShardError, match="train.total_batch_tokens"):
        loader(data, tmp_path, total=2048)
