"""The SIGTERM checkpoint goes to local disk first, to the root after: a real
trainer process is stopped by SIGTERM and SIGKILLed between the two (what a
preemption whose kill window ends mid-upload does); the next trainer on the
same machine uploads the local copy and resumes from it, ending with the
weights of an uninterrupted run. A damaged or older local copy is ignored."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpt2.checkpoint import staging, store
from gpt2.checkpoint.writer import KILL_AFTER_LOCAL_WRITE_ENV
from gpt2.process.kill_window import kill_window, window_warning
from gpt2.root import layout, storage
from tests.gpt2.train.fixtures import tiny_config, write_dataset, write_run_json
from tests.gpt2.train.test_train import assert_same_weights
from tests.gpt2.train.test_train_process import finish, launch, run_to_end, wait_for
from tests.tiers import scenario

REPO = Path(__file__).resolve().parents[3]
ONLY_AT_THE_END = {"train.checkpoint_every": 100}  # the SIGTERM save is the run's first


def _killed_after_local_write(config, tmp: Path) -> int:
    """Train in a subprocess, SIGTERM it after step 3; the test hook SIGKILLs it
    once the checkpoint is on local disk. Returns the step it saved."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", KILL_AFTER_LOCAL_WRITE_ENV: "1"}
    run_json = write_run_json(config, tmp / f"run-{time.monotonic_ns()}.json")
    proc = subprocess.Popen([sys.executable, "-m", "gpt2.train", "--config", str(run_json)], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    wait_for(proc, "step 3/8", lines)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, lines) == -signal.SIGKILL, "".join(lines[-30:])
    staged = store.complete_checkpoints(staging.staging_dir(config))
    assert len(staged) == 1, "".join(lines[-30:])
    return store.read_marker(staged[0])["step"]


@scenario
def test_a_local_copy_left_by_a_killed_upload_is_uploaded_and_resumed(tmp_path):
    reference = tiny_config(tmp_path / "reference", **ONLY_AT_THE_END)
    write_dataset(reference)
    expected = run_to_end(reference, tmp_path / "reference")

    config = tiny_config(tmp_path / "run", **ONLY_AT_THE_END)
    write_dataset(config)
    step = _killed_after_local_write(config, tmp_path)
    assert 3 <= step < 8
    assert store.latest_checkpoint(config) is None  # written locally first: the root never got it

    result = run_to_end(config, tmp_path / "run")
    assert result["resumed_from_step"] == step and result["steps"] == 8
    assert_same_weights(result["checkpoint"], expected["checkpoint"])
    assert storage.list_dir(layout.checkpoints_dir(staging.staging_dir(config))) == []  # uploaded: not kept


def test_a_flipped_byte_in_the_local_copy_makes_it_ignored(tmp_path, caplog):
    config = tiny_config(tmp_path, **ONLY_AT_THE_END)
    write_dataset(config)
    step = _killed_after_local_write(config, tmp_path)
    local = storage.local_path(layout.checkpoint_dir(staging.staging_dir(config), step)) / "optimizer.pt"
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0x01
    local.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="gpt2.checkpoint.staging"):
        assert staging.recover(config) is None
    assert "ignoring damaged local checkpoint" in caplog.text and "optimizer.pt" in caplog.text
    assert store.latest_checkpoint(config) is None and storage.list_dir(staging.staging_dir(config)) == []


def test_a_local_copy_the_root_has_passed_is_ignored(tmp_path, caplog):
    config = tiny_config(tmp_path)
    staging.claim(config)  # as the trainer does before it stages anything
    _staged(config, step=2)
    _staged(config, layout.run_dir(config), step=4)
    with caplog.at_level(logging.INFO, logger="gpt2.checkpoint.staging"):
        assert staging.recover(config) is None
    assert "the root already has step 4" in caplog.text
    assert store.latest_checkpoint(config).endswith("step_000004")
    assert storage.list_dir(staging.staging_dir(config)) == []


def test_a_save_longer_than_the_kill_window_names_what_to_change():
    assert kill_window(distributed=True)[0] == 30.0 and kill_window(distributed=False)[0] >= 30.0
    assert window_warning(10, 12.0, 1.0, (30.0, "torchrun")) is None
    slow_upload = window_warning(10, 45.0, 2.0, (30.0, "torchrun"))
    assert "45.0 s (local write 2.0 s)" in slow_upload and "termination_grace_period_seconds" in slow_upload
    slow_disk = window_warning(10, 45.0, 40.0, (30.0, "torchrun"))
    assert "not even its local copy" in slow_disk and "runtime.work_dir" in slow_disk


@scenario
def test_two_roots_on_one_machine_stage_apart_and_a_copy_staged_for_one_never_enters_the_other(tmp_path):
    """One machine, one work dir, the same config on two roots (a bucket run and
    a local try, say): root a's trainer is killed after its local write; then
    root b's trainer and a's rerun start at once. b must train from scratch
    (never resume from a's copy), a must resume from it, and both end with the
    weights of the same uninterrupted run."""
    same_machine = {**ONLY_AT_THE_END, "runtime.work_dir": str(tmp_path / "work")}
    a, b = (tiny_config(tmp_path / name, **same_machine) for name in ("a", "b"))
    for config in (a, b):
        write_dataset(config)
    assert layout.run_name(a) == layout.run_name(b) and staging.staging_dir(a) != staging.staging_dir(b)
    step = _killed_after_local_write(a, tmp_path)

    procs = {name: launch(config, tmp_path / name) for name, config in (("a", a), ("b", b))}
    lines = {name: [] for name in procs}
    for name, proc in procs.items():
        assert finish(proc, lines[name]) == 0, "".join(lines[name][-30:])
    result = {name: json.loads((tmp_path / name / "result.json").read_text()) for name in procs}
    assert result["b"]["resumed_from_step"] == 0 and result["a"]["resumed_from_step"] == step
    assert_same_weights(result["a"]["checkpoint"], result["b"]["checkpoint"])
    for config in (a, b):
        assert storage.list_dir(layout.checkpoints_dir(staging.staging_dir(config))) == []


def _staged(config, where: str | None = None, step: int = 2) -> str:
    """A real checkpoint of step `step` under `where` (default: the run's staging directory)."""
    import torch

    from gpt2.model import GPT

    model = GPT(config.model)
    url = layout.checkpoint_dir(where or staging.staging_dir(config), step)
    store.save_checkpoint(url, model, torch.optim.AdamW(model.parameters()), {"step": step}, {})
    return url


def test_a_staged_copy_recorded_for_another_root_or_none_is_set_aside_not_uploaded(tmp_path, caplog):
    config = tiny_config(tmp_path / "root")
    local = storage.local_path(staging.staging_dir(config))
    for record in ({"root": "gs://another-bucket/runs"}, None):
        _staged(config)
        if record is not None:
            storage.write_json_atomic(storage.join(staging.staging_dir(config), staging.ROOT_RECORD), record)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gpt2.checkpoint.staging"):
            assert staging.recover(config) is None
        assert "not uploading the local checkpoints" in caplog.text
        assert (record or {"root": "(not recorded)"})["root"] in caplog.text and layout.root(config) in caplog.text
        assert store.latest_checkpoint(config) is None and not local.exists()
        staging.claim(config)  # what the trainer does next: its own, empty staging directory
        assert store.complete_checkpoints(staging.staging_dir(config)) == []
        storage.remove(staging.staging_dir(config), recursive=True)
    kept = sorted(local.parent.glob(f"{local.name}.not-this-root-*"))
    assert len(kept) == 2 and all(store.complete_checkpoints(p.as_uri()) for p in kept)  # nothing deleted

    staging.claim(config)  # recorded for this root: uploaded
    _staged(config)
    assert staging.recover(config) == layout.checkpoint_dir(layout.run_dir(config), 2)


def test_a_copy_in_the_layout_before_root_keyed_staging_is_named_not_uploaded(tmp_path, caplog):
    config = tiny_config(tmp_path / "root")
    legacy = _staged(config, layout.legacy_checkpoint_staging_dir(config))
    with caplog.at_level(logging.WARNING, logger="gpt2.checkpoint.staging"):
        assert staging.recover(config) is None
    assert "staged by an earlier release" in caplog.text and layout.legacy_checkpoint_staging_dir(config) in caplog.text
    assert store.latest_checkpoint(config) is None and store.complete_checkpoints(
        layout.legacy_checkpoint_staging_dir(config)) == [legacy]
