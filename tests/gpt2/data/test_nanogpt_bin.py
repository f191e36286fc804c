"""nanoGPT's token files as a source: raw uint16 pairs written here become llm.c
shards holding exactly their ids in order, val.bin as the val split; the same
through fsspec (memory://) and from a glob; bad files refused by name before
any shard is written; a meta.pkl beside them never opened."""

from __future__ import annotations

import pickle
from pathlib import Path

import fsspec
import numpy as np
import pytest

from gpt2.config import identity
from gpt2.config.data import SourceError
from gpt2.config.overrides import ConfigError
from gpt2.data import prepare
from gpt2.data.download import resolve_source
from gpt2.data.llmc import MAGIC, make_header
from gpt2.root import layout
from gpt2.tokenizer import EOT_TOKEN
from tests.gpt2.data.test_prepare import shards_of


def token_files(rng: np.random.Generator, n_docs: int) -> np.ndarray:
    """nanoGPT's layout: each document's ids followed by <|endoftext|>."""
    docs = [np.append(rng.integers(0, EOT_TOKEN, rng.integers(5, 60)), EOT_TOKEN) for _ in range(n_docs)]
    return np.concatenate(docs).astype("<u2")


@pytest.fixture
def nanogpt_dir(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "owt"
    folder.mkdir()
    val, train = token_files(rng, 20), token_files(rng, 400)
    (folder / "val.bin").write_bytes(val.tobytes())
    (folder / "train.bin").write_bytes(train.tobytes())
    return folder, val, train


def config_for(smoke_config, source: str, **overrides):
    return smoke_config(**{"data.source_format": "nanogpt-bin", "data.source": source,
                           "data.shard_size": 4096, **overrides})


def test_shards_hold_exactly_the_files_ids_in_order_val_from_val_bin(smoke_config, nanogpt_dir):
    folder, val, train = nanogpt_dir
    (folder / "meta.pkl").write_bytes(b"cos\nsystem\n(S'exit 1'\ntR.")  # would run code if unpickled
    config = config_for(smoke_config, str(folder))
    result = prepare.prepare_data(config, show_progress=False)
    parts = shards_of(result)
    assert [s for s, _ in parts] == ["val"] + ["train"] * (len([s for s, _ in parts]) - 1)
    got_val = np.concatenate([t for s, t in parts if s == "val"])
    got_train = np.concatenate([t for s, t in parts if s == "train"])
    assert np.array_equal(got_val, val) and np.array_equal(got_train, train)
    assert len(parts) > 2  # train.bin was cut into several shards of data.shard_size
    assert (result.val_tokens, result.train_tokens) == (len(val), len(train))
    assert result.documents == 420  # the end-of-text tokens the files hold
    # Cached like any data stage: a second run finds the manifest.
    assert prepare.prepare_data(config, show_progress=False) == result


def test_read_through_fsspec_and_a_glob(smoke_config, nanogpt_dir):
    folder, val, train = nanogpt_dir
    fs = fsspec.filesystem("memory")
    for name in ("val.bin", "train.bin"):
        fs.pipe(f"/owt-copy/{name}", (folder / name).read_bytes())
    remote = prepare.prepare_data(config_for(smoke_config, "memory://owt-copy"), show_progress=False)
    local = prepare.prepare_data(config_for(smoke_config, str(folder / "*.bin")), show_progress=False)
    for result in (remote, local):
        stream = np.concatenate([t for _, t in shards_of(result)])
        assert np.array_equal(stream, np.concatenate([val, train]))


def test_the_key_is_part_of_the_data_identity_and_auto_keeps_it(smoke_config, nanogpt_dir):
    folder, _, _ = nanogpt_dir
    auto = smoke_config(**{"data.source": str(folder)})
    assert identity.data_fingerprint(auto) == identity.data_fingerprint(
        smoke_config(**{"data.source": str(folder), "data.source_format": "auto"}))
    assert "source_format" not in identity.data_identity(auto)["data"]
    bins = config_for(smoke_config, str(folder))
    for step in ("download", "tokenize", "shard"):
        assert identity.data_step_fingerprint(bins, step) != identity.data_step_fingerprint(
            auto.model_copy(update={"data": bins.data.model_copy(update={"source_format": "auto"})}), step)


def _write(folder: Path, val: np.ndarray | bytes, train: np.ndarray | bytes) -> None:
    folder.mkdir(exist_ok=True)
    for name, data in (("val.bin", val), ("train.bin", train)):
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.astype("<u2").tobytes())


GOOD = np.append(np.arange(1000, 1100), EOT_TOKEN).astype("<u2")


@pytest.mark.parametrize("val, train, words", [
    (GOOD.tobytes() + b"\x01", GOOD, ["val.bin", "odd size (203 bytes)"]),
    (GOOD, np.append(GOOD, [50257, 5]), ["train.bin", "token 101", "id 50257", "GPT-2's vocabulary"]),
    (GOOD, make_header(len(GOOD)) + GOOD.astype("<u2").tobytes(), ["train.bin", "llm.c's shard header",
                                                                    str(MAGIC)]),
], ids=["odd-size", "id-out-of-vocabulary", "llmc-header"])
def test_bad_files_are_refused_by_name_before_any_shard(smoke_config, tmp_path, val, train, words):
    folder = tmp_path / "bad"
    _write(folder, val, train)
    config = config_for(smoke_config, str(folder))
    with pytest.raises(SourceError) as err:
        prepare.prepare_data(config, show_progress=False)
    assert all(w in str(err.value) for w in words), err.value
    assert "\n" not in str(err.value)
    assert not layout.data_step_dir(config, "shard").exists() or not any(
        layout.data_step_dir(config, "shard").glob("*.bin"))


def test_missing_or_extra_files_and_bin_files_read_as_text(smoke_config, tmp_path):
    _write(tmp_path / "only", GOOD, GOOD)
    (tmp_path / "only" / "val.bin").unlink()
    with pytest.raises(SourceError, match="lacks val.bin"):
        resolve_source(config_for(smoke_config, str(tmp_path / "only")).data)
    _write(tmp_path / "extra", GOOD, GOOD)
    (tmp_path / "extra" / "fineweb_train_000001.bin").write_bytes(make_header(0))
    with pytest.raises(SourceError, match="also holds fineweb_train_000001.bin"):
        resolve_source(config_for(smoke_config, str(tmp_path / "extra")).data)
    # The reverse: nanoGPT's files given as text.
    with pytest.raises(SourceError, match="data.source_format=nanogpt-bin"):
        resolve_source(smoke_config(**{"data.source": str(tmp_path / "only" / "*.bin")}).data)


def test_limits_and_builtin_sources_are_refused_in_the_config(smoke_config, tmp_path):
    with pytest.raises(ConfigError, match="data.max_tokens does not apply to data.source_format=nanogpt-bin"):
        config_for(smoke_config, str(tmp_path), **{"data.max_tokens": 100})
    with pytest.raises(ConfigError, match="not nanoGPT's token files"):
        config_for(smoke_config, "builtin:python-docs")


def test_meta_pkl_is_never_unpickled(smoke_config, nanogpt_dir, monkeypatch):
    folder, _, _ = nanogpt_dir
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 50257}))
    opened = []
    monkeypatch.setattr(pickle, "load", lambda *a, **k: opened.append(a))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: opened.append(a))
    source = resolve_source(config_for(smoke_config, str(folder)).data)
    assert [Path(f).name for f in source.files] == ["val.bin", "train.bin"]
    prepare.prepare_data(config_for(smoke_config, str(folder)), show_progress=False)
    assert opened == []

