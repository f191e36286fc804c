"""A warm restart for real (#28): a compiled run's first attempt saves its
program under the run; the next attempt, in a fresh process with an empty
inductor cache directory (a new machine), loads it and trains exactly what a
cold start trains; a damaged program is refused, compiled cold and replaced."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt2.checkpoint import store
from gpt2.root import layout, storage
from gpt2.train import compile_cache
from tests.gpt2.train.fixtures import tiny_config, write_dataset, write_run_json
from tests.gpt2.train.test_train_process import REPO, finish
from tests.tiers import SCENARIO

pytestmark = [*SCENARIO, pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                            reason="inductor's CPU backend needs a C++ compiler")]


def _attempt(config, tmp: Path, cache_dir: Path) -> dict:
    """One attempt in a fresh process, with its own inductor cache directory."""
    run_json = write_run_json(config, tmp / f"run-{time.monotonic_ns()}.json")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
           compile_cache.SECRET_ENV: "this deployment's secret", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    result = tmp / "result.json"
    proc = subprocess.Popen([sys.executable, "-m", "gpt2.train", "--config", str(run_json), "--result", str(result)],
                            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    assert finish(proc, lines) == 0, "".join(lines[-40:])
    return {**json.loads(result.read_text()), "log": "".join(lines)}


def _as_if_killed_after_step_2(config) -> None:
    shutil.rmtree(storage.local_path(store.latest_checkpoint(config)))


def test_a_restart_on_an_empty_cache_loads_the_program_and_trains_what_a_cold_start_trains(tmp_path):
    config = tiny_config(tmp_path, **{"runtime.compile": True, "train.max_steps": 4, "tracking.enabled": False})
    write_dataset(config)
    first = _attempt(config, tmp_path, tmp_path / "cache-1")
    assert first["compile_cache"] == "saved" and first["steps"] == 4
    blobs = storage.list_dir(storage.join(layout.run_dir(config), "compile"))
    assert len(blobs) == 1 and blobs[0].endswith(".bin")

    _as_if_killed_after_step_2(config)
    warm = _attempt(config, tmp_path, tmp_path / "cache-2")
    assert warm["compile_cache"] == "loaded" and warm["resumed_from_step"] == 2
    assert "compiled program loaded from" in warm["log"]
    assert list((tmp_path / "cache-2").rglob("*.so"))  # the compiled C++ objects travelled
    # Loading never changes what is trained: the same losses as the cold attempt, bit for bit.
    assert (warm["final_train_loss"], warm["final_val_loss"]) == (first["final_train_loss"], first["final_val_loss"])

    url = storage.join(layout.run_dir(config), "compile", blobs[0])
    blob = storage.read_bytes(url)
    storage.write_bytes_atomic(url, blob[:-10] + bytes([blob[-10] ^ 0x01]) + blob[-9:])  # one flipped bit
    _as_if_killed_after_step_2(config)
    # On the first attempt's machine (its inductor cache): the refused program is compiled again
    # from the kernels inductor kept there, without g++ building them a second time (the cold
    # start on an empty cache is the first attempt's).
    cold = _attempt(config, tmp_path, tmp_path / "cache-1")
    assert cold["compile_cache"] == "saved" and "not used" in cold["log"]  # refused, compiled cold, replaced
    assert (cold["final_train_loss"], cold["final_val_loss"]) == (first["final_train_loss"], first["final_val_loss"])
    assert storage.read_bytes(url) != blob[:-10] + bytes([blob[-10] ^ 0x01]) + blob[-9:]
