"""The compiled program's travel (gpt2.train.compile_cache) against what the world
delivers: a blob that loads into an empty cache directory byte for byte, and
each bad blob (one flipped byte, truncated, another key, another secret, a
path out of the cache, an unreadable compile/ entry, two writers at once)
refused with one warning, writing nothing. The files stand in for what
inductor writes; the trainer's own warm restart is in
tests/gpt2/train/test_warm_restart.py."""

from __future__ import annotations

import io
import logging
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest
import torch

from gpt2.root import storage
from gpt2.train import compile_cache
from tests.gpt2.train.fixtures import tiny_config

FILES = {"ab/kernel.so": b"\x7fELF compiled", "fxgraph/xy/entry": b"graph entry", "triton/0/k.cubin": b"cubin"}


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A config, its key fields, and a compiled program's files in cache directory `a`."""
    # torch records every compile of this process for save_cache_artifacts(): a test that compiled
    # earlier in the same worker must not add its entries to the program these tests pack.
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()
    monkeypatch.setenv(compile_cache.SECRET_ENV, "the deployment's secret")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "a"))
    config = tiny_config(tmp_path / "root", **{"runtime.compile": True})
    fields = compile_cache.key_fields(config, torch.device("cpu"), 4, False, 1)
    since = time.time() - 1
    for rel, data in FILES.items():
        path = tmp_path / "a" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return config, fields, since


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _into_empty_cache(tmp_path, monkeypatch, name: str) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / name))
    return tmp_path / name


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_a_saved_program_loads_into_an_empty_cache_directory_byte_for_byte(setup, tmp_path, monkeypatch):
    config, fields, since = setup
    url = compile_cache.save(config, fields, since)
    assert url == compile_cache.blob_url(config, compile_cache.key_of(fields))
    assert compile_cache.save(config, fields, since) is None  # once per key
    b = _into_empty_cache(tmp_path, monkeypatch, "b")
    assert compile_cache.load(config, fields) == "loaded"
    assert _files(b) == FILES


def test_the_key_changes_with_whatever_makes_a_program_unusable_elsewhere(setup):
    config, fields, _ = setup
    key = compile_cache.key_of(fields)
    for change in ({"torch": "2.99.0"}, {"micro_batch": 8}, {"world_size": 2}, {"recompute": True},
                   {"cpu_flags": "another"}, {"dtype": "bfloat16"}):
        assert compile_cache.key_of({**fields, **change}) != key, change
    # Another torch finds no blob of its own: it compiles cold, quietly.
    assert compile_cache.save(config, fields, setup[2])
    assert compile_cache.load(config, {**fields, "torch": "2.99.0"}) == "absent"


def test_the_key_takes_the_precision_the_run_trains_in(setup):
    """fp16 and bf16 runs compile different programs; a CPU run's key (fp32) is what it was."""
    config, fields, _ = setup
    cpu = torch.device("cpu")
    assert fields["dtype"] == "float32"  # every CPU key so far: its programs still load
    assert compile_cache.key_fields(config, cpu, 4, False, 1, "fp32") == fields
    keys = {p: compile_cache.key_of(compile_cache.key_fields(config, cpu, 4, False, 1, p))
            for p in ("bf16", "fp16", "fp32")}
    assert len(set(keys.values())) == 3 and keys["fp32"] == compile_cache.key_of(fields)


def _damaged(blob: bytes, how: str) -> bytes:
    if how == "flipped":
        return blob[:-10] + bytes([blob[-10] ^ 0x01]) + blob[-9:]
    if how == "truncated":
        return blob[: len(blob) - 100]
    raise ValueError(how)


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_a_damaged_blob_is_refused_with_one_warning_and_writes_nothing(setup, tmp_path, monkeypatch, caplog, how):
    config, fields, since = setup
    url = compile_cache.save(config, fields, since)
    storage.write_bytes_atomic(url, _damaged(storage.read_bytes(url), how))
    b = _into_empty_cache(tmp_path, monkeypatch, "b")
    with caplog.at_level(logging.WARNING, logger="gpt2.train.compile_cache"):
        assert compile_cache.load(config, fields) == "refused"
    [warning] = _warnings(caplog)
    assert "compiling cold" in warning
    assert _files(b) == {}
    # The attempt that compiled cold replaces it, and the next one loads.
    assert compile_cache.save(config, fields, since, replace=True) == url
    assert compile_cache.load(config, fields) == "loaded"


def test_a_blob_signed_with_another_secret_runs_nothing(setup, tmp_path, monkeypatch, caplog):
    """The root is data, never code: whoever can write the bucket cannot plant a program."""
    config, fields, since = setup
    monkeypatch.setenv(compile_cache.SECRET_ENV, "a bucket writer's guess")
    compile_cache.save(config, fields, since)
    monkeypatch.setenv(compile_cache.SECRET_ENV, "the deployment's secret")
    b = _into_empty_cache(tmp_path, monkeypatch, "b")
    with caplog.at_level(logging.WARNING, logger="gpt2.train.compile_cache"):
        assert compile_cache.load(config, fields) == "refused"
    assert "signature" in caplog.text and _files(b) == {}


def test_a_signed_blob_whose_path_leaves_the_cache_directory_writes_nothing(setup, tmp_path, monkeypatch):
    config, fields, _ = setup
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(compile_cache.FILES + "../../escaped")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    payload = buf.getvalue()
    monkeypatch.setattr(compile_cache, "pack", lambda since: payload)  # a blob made by hand, signed as ours
    compile_cache.save(config, fields, 0.0)
    b = _into_empty_cache(tmp_path, monkeypatch, "b")
    assert compile_cache.load(config, fields) == "refused"
    assert not (tmp_path / "escaped").exists() and not (b.parent / "escaped").exists() and _files(b) == {}


def test_an_unreadable_compile_entry_compiles_cold(setup, caplog):
    config, fields, _ = setup
    url = compile_cache.blob_url(config, compile_cache.key_of(fields))
    storage.local_path(url).mkdir(parents=True)  # a directory where the blob should be
    with caplog.at_level(logging.WARNING, logger="gpt2.train.compile_cache"):
        assert compile_cache.load(config, fields) == "refused"
    assert len(_warnings(caplog)) == 1


def test_two_attempts_saving_at_once_leave_one_whole_blob(setup, tmp_path, monkeypatch):
    config, fields, since = setup
    results = []
    writers = [threading.Thread(target=lambda: results.append(compile_cache.save(config, fields, since, replace=True)))
               for _ in range(2)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert len(results) == 2 and all(results)
    _into_empty_cache(tmp_path, monkeypatch, "b")
    assert compile_cache.load(config, fields) == "loaded"


def test_without_the_deployment_secret_a_machine_signs_with_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv(compile_cache.SECRET_ENV, raising=False)
    config = tiny_config(tmp_path / "root")
    first = compile_cache.secret(config)
    assert compile_cache.secret(config) == first and len(first) == 64
    path = config.runtime.work_root / "compile-cache.secret"
    assert path.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(compile_cache.SECRET_ENV, "shared")
    assert compile_cache.secret(config) == b"shared"
    assert os.environ[compile_cache.SECRET_ENV] == "shared"
