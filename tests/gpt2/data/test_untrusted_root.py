"""The root is shared and untrusted: manifests naming paths outside their
directory are refused before any I/O, shards holding ids outside GPT-2's
vocabulary are refused naming the shard and the offset, and a remote shard's
local copy is keyed by content, so a second dataset with the same name and
sizes never trains on the first one's bytes."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
import torch

from gpt2.data.llmc import ShardError, make_header, read_shard, write_shard
from gpt2.data.loader import TrainLoader
from gpt2.data.manifest import ManifestError, load_manifest, verify_manifest, verify_shard
from gpt2.data.shard_source import ShardSource, cached_name
from gpt2.process.distributed import DistEnv
from gpt2.root import layout, storage
from tests.gpt2.train.fixtures import tiny_config, write_dataset

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _rewrite_manifest(url: str, **changes) -> dict:
    raw = json.loads(storage.read_bytes(url))
    raw.update(changes)
    storage.write_json_atomic(url, raw)
    return raw


@pytest.mark.parametrize("bad", ["../../victim.bin", "/etc/hostname", "sub/x.bin", "..", ".hidden.bin", ""])
def test_a_manifest_naming_a_path_outside_its_directory_is_refused_before_io(tmp_path, bad):
    config = tiny_config(tmp_path / "root")
    url = write_dataset(config, train_shards=1, shard_tokens=1000, val_tokens=400)
    raw = json.loads(storage.read_bytes(url))
    raw["shards"][1]["path"] = bad
    storage.write_json_atomic(url, raw)
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"keep me")

    with pytest.raises(ManifestError, match=r"shards\.1\.path.*not a plain file name") as err:
        load_manifest(url)
    assert url in str(err.value) and "gpt2 prepare" in str(err.value)
    with pytest.raises(ManifestError):
        verify_manifest(url, checksum=True)
    assert victim.read_bytes() == b"keep me"


def test_a_manifest_name_with_a_separator_is_refused(tmp_path):
    config = tiny_config(tmp_path / "root")
    url = write_dataset(config, train_shards=1, shard_tokens=1000, val_tokens=400)
    _rewrite_manifest(url, name="../elsewhere")
    with pytest.raises(ManifestError, match="name.*not a plain file name"):
        load_manifest(url)


@pytest.mark.parametrize("torn", [b"", b'{"format": "llmc-shards-v1", "name": "x", "shar', b"\x00" * 64])
def test_a_torn_manifest_is_an_error_naming_it_and_the_repair(tmp_path, torn):
    config = tiny_config(tmp_path / "root")
    url = write_dataset(config, train_shards=1, shard_tokens=1000, val_tokens=400)
    storage.write_bytes_atomic(url, torn)
    with pytest.raises(ManifestError, match="damaged.*rerun `gpt2 prepare`") as err:
        load_manifest(url)
    assert url in str(err.value)


def _raw_shard(tokens: np.ndarray) -> tuple[bytes, str]:
    """A shard's bytes written without write_shard's checks (as a foreign tool would)."""
    data = make_header(len(tokens)) + tokens.astype("<u2").tobytes()
    return data, hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("bad_id", [50257, 50303, 50304, 65535])
def test_ids_outside_gpt2s_vocabulary_are_refused_naming_shard_and_offset(tmp_path, bad_id):
    tokens = np.arange(1000, dtype=np.uint16) % 50257
    tokens[777] = bad_id
    with pytest.raises(ShardError, match=f"token 777 .*id {bad_id}"):
        write_shard(io.BytesIO(), [tokens[:500], tokens[500:]], "x_train_000001.bin")

    # A shard in the root holding one (its manifest entry matching it byte for byte).
    config = tiny_config(tmp_path / "root")
    url = write_dataset(config, train_shards=1, shard_tokens=1000, val_tokens=400)
    manifest = load_manifest(url)
    entry = manifest.split("train")[0]
    data, sha = _raw_shard(tokens)
    shard_url = layout.shard(url, entry.path)
    storage.write_bytes_atomic(shard_url, data)
    raw = manifest.model_dump(mode="json")
    raw["shards"][1]["sha256"] = sha
    storage.write_json_atomic(url, raw)
    entry = load_manifest(url).split("train")[0]

    with pytest.raises(ShardError, match=f"{entry.path}: token 777 \\(byte {1024 + 2 * 777}\\) is id {bad_id}"):
        verify_shard(shard_url, entry, checksum=True)
    with pytest.raises(ShardError, match=f"{entry.path}: token 777"):
        read_shard(storage.local_path(shard_url))
    source = ShardSource(url, load_manifest(url), tmp_path / "cache", ENV)
    with pytest.raises(ShardError, match=f"{entry.path}: token 777"):
        TrainLoader(source, 32, 256, 4, ENV).next_batches()


def test_a_second_dataset_with_the_same_name_and_sizes_trains_on_its_own_bytes(gcs_emulator, tmp_path):
    """Two roots holding the same dataset name, fingerprint and shard sizes
    but other bytes (re-prepared after a tokenizer fix, say), read through
    one trainer's work directory."""
    cache = None
    for seed, root in enumerate((f"{gcs_emulator}/a", f"{gcs_emulator}/b")):
        config = tiny_config(root, **{"runtime.work_dir": str(tmp_path / "work")})
        url = write_dataset(config, train_shards=1, shard_tokens=1000, val_tokens=400, seed=seed)
        manifest = load_manifest(url)
        cache = layout.shard_cache_dir(config, manifest.name, manifest.fingerprint)
        loader = TrainLoader(ShardSource(url, manifest, cache, ENV), 32, 256, 4, ENV)
        x, y = loader.next_batches()[0]
        entry = manifest.split("train")[0]
        in_bucket = np.frombuffer(storage.read_bytes(layout.shard(url, entry.path))[1024:], dtype="<u2")
        assert x.flatten().tolist() == in_bucket[:128].tolist()
        assert y.flatten().tolist() == in_bucket[1:129].tolist()
    assert len(list(cache.glob("*.bin"))) == 2  # one copy per content, side by side


def test_a_cached_copy_is_checksummed_once_and_again_when_it_changes(tmp_path, monkeypatch):
    config = tiny_config("memory://content-cache")
    url = write_dataset(config, train_shards=1, shard_tokens=1000, val_tokens=400)
    manifest = load_manifest(url)
    entry = manifest.split("train")[0]
    cached = tmp_path / "cache" / cached_name(entry)
    checksums = []
    import gpt2.data.manifest as manifest_module

    real = manifest_module._checksum_and_check_ids
    monkeypatch.setattr(manifest_module, "_checksum_and_check_ids", lambda u: checksums.append(u) or real(u))

    def load():
        return ShardSource(url, manifest, tmp_path / "cache", ENV).tokens(entry)

    first = np.array(load())
    assert len(checksums) == 1 and cached.is_file()
    load()
    assert len(checksums) == 1  # remembered: no second pass over the bytes

    data = bytearray(cached.read_bytes())
    data[-1] ^= 0x01  # one flipped bit in the local copy
    cached.write_bytes(bytes(data))
    again = np.array(load())
    assert len(checksums) == 3  # the changed copy failed its check and was fetched again
    assert (again == first).all()
    storage.remove("memory://content-cache", recursive=True)
