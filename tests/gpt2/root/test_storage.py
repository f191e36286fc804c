"""The artifact root through real fsspec filesystems: local, memory, and a
GCS emulator on loopback; uploads stay atomic when one fails midway."""

from __future__ import annotations

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from gpt2.config.overrides import resolve_config
from gpt2.data import prepare
from gpt2.data.manifest import load_manifest, verify_manifest
from gpt2.root import layout, storage


class FlakyMemoryFileSystem(MemoryFileSystem):
    """Memory filesystem whose uploads die halfway after `budget` good ones,
    leaving the half-written bytes behind like a dropped connection would."""

    protocol = "flakymem"
    budget = 0

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith("flakymem://"):
            path = "memory://" + path[len("flakymem://"):]
        return super()._strip_protocol(path)

    def put_file(self, lpath, rpath, **kwargs):
        data = open(lpath, "rb").read()
        if FlakyMemoryFileSystem.budget <= 0:
            self.pipe_file(rpath, data[: len(data) // 2])
            raise ConnectionError("connection reset during upload")
        FlakyMemoryFileSystem.budget -= 1
        self.pipe_file(rpath, data)


fsspec.register_implementation("flakymem", FlakyMemoryFileSystem, clobber=True)


def _names(fs, prefix: str) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in fs.find(prefix))


def test_failure_mid_upload_leaves_no_partial_file(tmp_path):
    config = resolve_config("smoke", {"runtime.work_dir": str(tmp_path / "w"), "data.shard_size": 20_000},
                            root="flakymem://bucket/root")
    fs = FlakyMemoryFileSystem()
    FlakyMemoryFileSystem.budget = 3  # the 4th shard upload breaks halfway
    with pytest.raises(ConnectionError):
        prepare.prepare_data(config, show_progress=False)
    names = _names(fs, "/bucket/root/data")
    assert "manifest.json" not in names
    assert len(names) == 3 and not any(".tmp" in n for n in names), names
    d = f"/bucket/root/data/{load_dir(fs)}"
    local = {p.name: p.stat().st_size for p in layout.data_step_dir(config, "shard").glob("*.bin")}
    for name in names:  # what is visible under a final name is whole
        assert fs.size(f"{d}/{name}") == local[name]
    FlakyMemoryFileSystem.budget = 10**6
    resumed = prepare.prepare_data(config, show_progress=False)
    verify_manifest(resumed.manifest, checksum=True)

    clean_cfg = resolve_config("smoke", {"runtime.work_dir": str(tmp_path / "w2"), "data.shard_size": 20_000},
                               root="memory://clean/root")
    clean = prepare.prepare_data(clean_cfg, show_progress=False)
    a, b = load_manifest(clean.manifest), load_manifest(resumed.manifest)
    assert [(e.path, e.sha256) for e in a.shards] == [(e.path, e.sha256) for e in b.shards]


def load_dir(fs) -> str:
    (d,) = fs.ls("/bucket/root/data", detail=False)
    return d.rsplit("/", 1)[-1]


def test_atomic_json_write_roundtrip_memory():
    url = "memory://t/a/b.json"
    storage.write_json_atomic(url, {"x": 1})
    assert storage.read_json(url) == {"x": 1}
    assert storage.list_dir("memory://t/a") == ["b.json"]


def test_normalize_url_makes_local_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.normalize_url("artifacts") == f"file://{tmp_path}/artifacts"
    assert storage.normalize_url("file://./artifacts") == f"file://{tmp_path}/artifacts"
    assert storage.normalize_url("gs://b/p/") == "gs://b/p"


def test_prepare_to_gcs_emulator(gcs_emulator, tmp_path):
    config = resolve_config("smoke", {"runtime.work_dir": str(tmp_path / "w")}, root=gcs_emulator)
    result = prepare.prepare_data(config, show_progress=False)
    assert result.manifest.startswith("gs://gpt2-test-bucket/prefix/data/")
    manifest = verify_manifest(result.manifest, checksum=True)
    assert manifest.split("val") and manifest.split("train")
    # A second run finds the finished manifest and does no work.
    again = prepare.prepare_data(config, show_progress=False)
    assert again == result
