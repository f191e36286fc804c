"""A torn, empty or unparseable bookkeeping record means "not done": the rerun
redoes that step and ends with the same shards as a clean run. And a write
that fails midway (a full disk) leaves no partial file under a final name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpt2.config.overrides import resolve_config
from gpt2.data import prepare
from gpt2.data.download import download_source
from gpt2.data.manifest import load_manifest
from gpt2.data.shard import DONE_RECORD as SHARD_DONE
from gpt2.data.tokenize import tokenize_source
from gpt2.data.tokenized import DONE_RECORD as TOKENIZE_DONE
from gpt2.root import layout
from gpt2.root.storage import local_path
from tests.conftest import write_jsonl


@pytest.fixture
def corpus(tmp_path, prose_docs):
    src = write_jsonl(tmp_path / "corpus.jsonl", prose_docs)
    return {"data.source": str(src), "data.val_tokens": 2000, "data.shard_size": 8192,
            "runtime.tokenize_part_tokens": 3000}


def _config(tmp_path, corpus, name):
    return resolve_config("smoke", {**corpus, "runtime.work_dir": str(tmp_path / name / "work")},
                          root=str(tmp_path / name / "root"))


def _shards(manifest_url):
    return [(e.path, e.sha256) for e in load_manifest(manifest_url).shards]


@pytest.fixture
def clean(tmp_path, corpus):
    return _shards(prepare.prepare_data(_config(tmp_path, corpus, "clean"), show_progress=False).manifest)


def _tear(path, how):
    data = path.read_bytes()
    path.write_bytes(b"" if how == "empty" else data[: len(data) // 2])


@pytest.mark.parametrize("how", ["empty", "torn"])
def test_a_damaged_part_record_is_redone(tmp_path, corpus, clean, how):
    config = _config(tmp_path, corpus, "run")

    def crash_after_some_parts(docs, tokens, total):
        if tokens > 20_000:
            raise KeyboardInterrupt  # the closest in-process stand-in for a kill

    with pytest.raises(KeyboardInterrupt):
        tokenize_source(config, download_source(config), crash_after_some_parts, show_progress=False)
    records = sorted(layout.data_step_dir(config, "tokenize").glob("part_*.json"))
    assert len(records) >= 2
    _tear(records[-1], how)  # the record being written when the kill came
    assert _shards(prepare.prepare_data(config, show_progress=False).manifest) == clean


@pytest.mark.parametrize("step", ["tokenize", "shard"])
@pytest.mark.parametrize("how", ["empty", "torn"])
def test_a_damaged_step_record_is_redone(tmp_path, corpus, clean, step, how):
    corpus = {**corpus, "runtime.keep_intermediate": "all"}  # the local shards' record stays too
    config = _config(tmp_path, corpus, "run")
    url = prepare.prepare_data(config, show_progress=False).manifest
    local_path(url).unlink()  # killed before the upload finished
    record = {"tokenize": TOKENIZE_DONE, "shard": SHARD_DONE}[step]
    _tear(layout.data_step_dir(config, step) / record, how)
    assert _shards(prepare.prepare_data(config, show_progress=False).manifest) == clean


@pytest.mark.parametrize("how", ["empty", "torn"])
def test_a_damaged_manifest_in_the_root_is_rebuilt(tmp_path, corpus, clean, how):
    config = _config(tmp_path, corpus, "run")
    url = prepare.prepare_data(config, show_progress=False).manifest
    _tear(local_path(url), how)
    assert _shards(prepare.prepare_data(config, show_progress=False).manifest) == clean


_PREPARE = """
import resource, signal, sys
from gpt2.data import prepare
from gpt2.config.overrides import resolve_config
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
config = resolve_config("smoke", dict(a.split("=", 1) for a in sys.argv[3:]), root=sys.argv[2])
prepare.prepare_data(config, show_progress=False)
"""


@pytest.mark.parametrize(("limit_kib", "shard_size", "step"), [(3, 8192, "tokenize"), (48, 32768, "shard")])
def test_a_full_disk_midway_loses_nothing_and_the_rerun_finishes(tmp_path, corpus, limit_kib, shard_size, step):
    """Files may grow to `limit_kib` only, so writing a token part (a work
    unit of ~2,500 tokens, ~5 KiB) or a shard (up to ~40 KiB) fails like a full disk. The run fails naming the error; nothing
    half-written carries a final name; the rerun with room finishes with the
    shards of a run that never failed."""
    corpus = {**corpus, "data.shard_size": shard_size}
    clean = _shards(prepare.prepare_data(_config(tmp_path, corpus, "clean"), show_progress=False).manifest)
    config = _config(tmp_path, corpus, "run")
    args = [f"{k}={v}" for k, v in {**corpus, "runtime.work_dir": str(tmp_path / "run" / "work")}.items()]
    proc = subprocess.run([sys.executable, "-c", _PREPARE, str(limit_kib * 1024), str(tmp_path / "run" / "root"),
                           *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "File too large" in proc.stderr
    assert f"gpt2/data/{step}.py" in proc.stderr  # it failed in the step this case is about
    work = layout.data_step_dir(config, step)
    finished = [p for p in work.iterdir() if not p.name.endswith(".tmp")]
    assert all(p.stat().st_size <= limit_kib * 1024 for p in finished)  # no partial file under a final name
    assert not (work / {"tokenize": TOKENIZE_DONE, "shard": SHARD_DONE}[step]).exists()
    assert not local_path(layout.manifest(config)).exists()
    assert _shards(prepare.prepare_data(config, show_progress=False).manifest) == clean
