"""Cache keys: a stage's identity plus the code version, never runtime settings."""

from __future__ import annotations

from gpt2.config.identity import data_step_fingerprint, train_fingerprint
from tasks.common import CODE_VERSION, identity_cache_key
from tasks.data import step_key
from tests.gpt2.train.fixtures import tiny_config


def test_train_key_ignores_runtime_and_follows_identity(tmp_path):
    key = identity_cache_key("train", train_fingerprint)
    a = tiny_config(tmp_path)
    moved = tiny_config(tmp_path / "elsewhere", **{"runtime.device": "cpu", "runtime.nproc_per_node": 4,
                                                   "runtime.num_workers": 7})
    other = tiny_config(tmp_path, **{"train.lr": 1e-4})
    assert key(None, {"config": a}) == key(None, {"config": moved}) != key(None, {"config": other})
    assert key(None, {"config": a}).endswith(f"-{CODE_VERSION}")


def test_a_new_shard_size_reshards_without_retokenizing(tmp_path):
    a = tiny_config(tmp_path)
    b = tiny_config(tmp_path, **{"data.shard_size": a.data.shard_size * 2})
    assert step_key("tokenize")(None, {"config": a}) == step_key("tokenize")(None, {"config": b})
    assert step_key("shard")(None, {"config": a}) != step_key("shard")(None, {"config": b})
    assert data_step_fingerprint(a, "download") == data_step_fingerprint(b, "download")
