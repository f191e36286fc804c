"""Every shard the run reads is checked against the manifest's sizes before
the first step (gpt2.data.manifest.check_shard_sizes)."""

from __future__ import annotations

import pytest

from gpt2.checkpoint import store
from gpt2.data.llmc import ShardError
from gpt2.data.manifest import check_shard_sizes, load_manifest
from gpt2.root import layout, storage
from gpt2.train.run import train
from tests.gpt2.train.fixtures import tiny_config, write_dataset


def _last_train_shard(config) -> str:
    manifest = load_manifest(layout.manifest(config))
    return layout.shard(layout.manifest(config), manifest.split("train")[-1].path)


def test_a_truncated_shard_the_run_has_not_reached_fails_before_the_first_step(tmp_path):
    # 8 steps of 256 tokens read 2,048 of the first train shard's 4,096: the
    # second is never opened, so before this check a cut one went unnoticed.
    config = tiny_config(tmp_path, **{"tracking.enabled": False})
    write_dataset(config)
    path = storage.local_path(_last_train_shard(config))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ShardError) as info:
        train(config)
    assert path.name in str(info.value) and "truncated" in str(info.value) and "gpt2 prepare" in str(info.value)
    assert store.latest_checkpoint(config) is None  # it never trained


def test_missing_and_wrong_sized_shards_are_all_named_at_once_on_any_filesystem():
    config = tiny_config("memory://shard-check/root")
    write_dataset(config)
    url = layout.manifest(config)
    manifest = load_manifest(url)
    check_shard_sizes(url, manifest)  # intact: nothing raised
    val, first, second = (layout.shard(url, e.path) for e in manifest.shards)
    storage.remove(val)
    storage.write_bytes_atomic(second, storage.read_bytes(second) + b"\0")
    with pytest.raises(ShardError) as info:
        check_shard_sizes(url, manifest)
    text = str(info.value)
    assert f"missing: {manifest.shards[0].path}" in text
    assert f"{manifest.shards[2].path} ({manifest.shards[2].bytes + 1} bytes" in text
    assert manifest.shards[1].path not in text
