"""#33 item 6: a root that is not writable (a read-only volume, a bucket
with read-only credentials) answers finished work from what it holds, with
no server, no lease and nothing written, and refuses anything else in one
line before any server starts.
The root is made read-only as the world makes one (tests/cli/read_only_mount.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpt2.root import layout
from tests.cli.read_only_mount import gpt2_read_only, needs_mount, sets, snapshot
from tests.gpt2.train.fixtures import TINY, tiny_config, write_dataset

pytestmark = needs_mount


@pytest.mark.parametrize("command", ["run", "train"])  # the pipeline, and train's own checks before its flow
def test_an_empty_read_only_root_is_refused_in_one_line_before_any_server(command, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    done = gpt2_read_only(root, command, "--preset", "smoke", "--root", str(root),
                           "--set", f"runtime.work_dir={tmp_path / 'work'}")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no MLflow retries, no traceback
    assert lines[0].startswith(f"error: artifact root file://{root} is not writable (OSError: [Errno 30] "
                               "Read-only file system"), lines[0]
    assert "A read-only root answers only finished work" in lines[0] and "Pass a writable --root" in lines[0]
    assert list(root.iterdir()) == []
    assert not (tmp_path / "work" / "prefect.db").exists()  # no temporary server was started


def test_a_finished_training_run_is_answered_from_a_read_only_root_without_a_lease(tmp_path, prefect_server):
    from flows.train import train_flow

    root = tmp_path / "root"
    overrides = {**TINY, "runtime.work_dir": str(tmp_path / "work"), "train.max_steps": 2,
                 "train.checkpoint_every": 2}
    config = tiny_config(root, **overrides)
    write_dataset(config)
    trained = train_flow("smoke", overrides, root=str(root))
    before = snapshot(root)

    done = gpt2_read_only(root, "train", "--preset", "smoke", "--root", str(root), "--json", *sets(overrides))
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["cached"] is True and answer["read_only"] is True
    for key in ("run_name", "checkpoint", "steps", "final_val_loss", "mlflow_run_id", "bill"):
        assert answer[key] == trained[key], key
    assert "is not writable" in done.stderr and "no server, no lease, nothing written" in done.stderr
    assert snapshot(root) == before  # nothing written: no lease, no result record, no MLflow row

    # --fresh would delete the run: refused, and nothing is.
    done = gpt2_read_only(root, "train", "--preset", "smoke", "--root", str(root), "--fresh", *sets(overrides))
    assert done.returncode == 1 and "--fresh deletes this run's checkpoints" in done.stderr, done.stderr
    assert snapshot(root) == before

    # A damaged final checkpoint is not an answer: it is named, as the flow names it.
    model = Path(layout.run_dir(config).removeprefix("file://")) / "checkpoints" / "step_000002" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    done = gpt2_read_only(root, "train", "--preset", "smoke", "--root", str(root), *sets(overrides))
    assert done.returncode == 1
    assert "the final checkpoint is damaged" in done.stderr and "model.safetensors" in done.stderr, done.stderr
