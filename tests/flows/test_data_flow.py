"""The `gpt2-data` flow and `gpt2 prepare` against a real temporary Prefect
server: Cached on rerun, recomputed on identity changes, never on runtime
ones; killed at any moment and rerun, it ends with the same manifest."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt2.data.manifest import load_manifest
from gpt2.root import layout
from gpt2.root.storage import local_path
from tests.conftest import write_jsonl
from tests.tiers import scenario


@pytest.fixture
def flow_args(tmp_path):
    def make(**overrides):
        return dict(preset="smoke", overrides={"runtime.work_dir": str(tmp_path / "work"), **overrides},
                    root=str(tmp_path / "root"))
    return make


def test_cache_follows_identity_not_runtime(prefect_server, flow_args):
    from flows.data import data_flow

    first = data_flow(**flow_args())
    assert first["cached"] is False and first["shards"] >= 2
    again = data_flow(**flow_args())
    assert again["cached"] is True
    assert again["mlflow_run_id"] == first["mlflow_run_id"]  # a cached stage adds no MLflow run
    assert again["cached_steps"] == ["download", "shard", "tokenize", "upload"]
    assert again["manifest"] == first["manifest"]
    # Runtime only: still cached.
    runtime_only = data_flow(**flow_args(**{"runtime.num_workers": 1}))
    assert runtime_only["cached"] is True and runtime_only["mlflow_run_id"] == first["mlflow_run_id"]
    # Identity: a new shard size re-shards and re-uploads, reusing the tokens.
    resharded = data_flow(**flow_args(**{"data.shard_size": 20_000}))
    assert resharded["cached"] is False
    assert resharded["cached_steps"] == ["download", "tokenize"]
    assert resharded["manifest"] != first["manifest"]
    assert resharded["total_tokens"] == first["total_tokens"]
    # A document limit re-tokenizes.
    limited = data_flow(**flow_args(**{"data.max_documents": 30}))
    assert limited["cached_steps"] == ["download"] and limited["documents"] == 30


def test_damaged_root_is_rebuilt(prefect_server, flow_args):
    from flows.data import data_flow

    first = data_flow(**flow_args())
    manifest = load_manifest(first["manifest"])
    victim = local_path(layout.shard(first["manifest"], manifest.shards[-1].path))
    victim.write_bytes(victim.read_bytes()[:-100])  # truncated by a bad copy
    repaired = data_flow(**flow_args())
    assert repaired["cached"] is False and "upload" not in repaired["cached_steps"]
    assert victim.stat().st_size == manifest.shards[-1].bytes
    assert data_flow(**flow_args())["cached"] is True


def test_torn_manifest_is_rebuilt(prefect_server, flow_args):
    from flows.data import data_flow

    first = data_flow(**flow_args())
    path = local_path(first["manifest"])
    path.write_bytes(path.read_bytes()[:100])  # killed mid-write on a filesystem without atomic renames
    repaired = data_flow(**flow_args())
    assert repaired["cached"] is False and repaired["manifest"] == first["manifest"]
    assert load_manifest(first["manifest"]).total_tokens == first["total_tokens"]


def _cli(args: list[str], api_url: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PREFECT_API_URL": api_url, "PYTHONUNBUFFERED": "1"}
    gpt2 = Path(sys.executable).with_name("gpt2")
    return subprocess.Popen([str(gpt2), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def test_cli_prepare_json(prefect_server, tmp_path):
    proc = _cli(["prepare", "--preset", "smoke", "--root", str(tmp_path / "root"),
                 "--set", f"runtime.work_dir={tmp_path / 'work'}", "--json"], prefect_server)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    for key in ("manifest", "total_tokens", "train_tokens", "val_tokens", "shards", "cached"):
        assert key in result
    assert result["train_tokens"] + result["val_tokens"] == result["total_tokens"]
    assert result["manifest"].startswith("file://") and result["cached"] is False


def test_cli_bad_input_exits_nonzero_with_named_error(prefect_server, tmp_path):
    missing = tmp_path / "nope-*.jsonl"
    proc = _cli(["prepare", "--root", str(tmp_path / "root"), "--set", f"data.source={missing}",
                 "--set", f"runtime.work_dir={tmp_path / 'work'}"], prefect_server)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "no files match" in err and str(missing) in err
    proc = _cli(["prepare", "--set", "data.shard_size=-5", "--set", "bogus.key=1"], prefect_server)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "data.shard_size" in err and "bogus.key" in err


@scenario
def test_kill_at_any_moment_then_rerun_gives_same_manifest(prefect_server, tmp_path, prose_docs):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", prose_docs * 6)
    sets = ["--set", f"data.source={corpus}", "--set", "data.val_tokens=5000", "--set", "data.shard_size=50000",
            "--set", "runtime.tokenize_part_tokens=20000", "--set", "runtime.num_workers=2"]

    def run(root: str, work: str, kill_after: float | None = None):
        proc = _cli(["prepare", "--root", root, "--set", f"runtime.work_dir={work}", *sets, "--json"],
                    prefect_server, start_new_session=True)
        if kill_after is None:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            return json.loads(out.strip().splitlines()[-1])
        time.sleep(kill_after)
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its tokenizer workers
        proc.communicate()
        return None

    clean = run(str(tmp_path / "clean"), str(tmp_path / "w-clean"))
    rng = random.Random(0)
    root, work = str(tmp_path / "killed"), str(tmp_path / "w-killed")
    for _ in range(3):
        run(root, work, kill_after=rng.uniform(2.0, 7.0))
    resumed = run(root, work)
    a, b = load_manifest(clean["manifest"]), load_manifest(resumed["manifest"])
    assert [(e.path, e.tokens, e.sha256) for e in a.shards] == [(e.path, e.tokens, e.sha256) for e in b.shards]
    assert resumed["total_tokens"] == clean["total_tokens"]
