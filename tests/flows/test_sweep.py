"""`gpt2 sweep` end to end on Prefect's temporary server, as a user runs it: a two-member smoke
sweep trains both members on one data stage, nests their pipeline runs under the sweep's MLflow
run with report.png beside the table; a member equals the same run made alone by `gpt2 run` on
another root, bit for bit on CPU; the rerun answers every member from its run, training nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.stack.fixtures import clean_env

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SHORT = ("--preset", "smoke", "--set", "train.max_steps=4")


def _gpt2(env: dict, cwd: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "cli.main", *args, "--json"], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, f"gpt2 {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _on(base: Path) -> tuple[str, ...]:
    return ("--root", str(base / "root"), "--set", f"runtime.work_dir={base / 'work'}")


def _weights(checkpoint: str) -> dict:
    from safetensors.torch import load_file

    from gpt2.root.storage import local_path

    return load_file(local_path(checkpoint) / "model.safetensors")


def test_a_sweep_trains_its_members_on_one_data_stage_as_runs_made_alone(tmp_path):
    import mlflow

    from gpt2.config.overrides import resolve_config

    env = {**clean_env(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    sweep = ("sweep", *SHORT, "--grid", "train.lr=1e-3,3e-3", *_on(tmp_path / "sweep"))
    first = _gpt2(env, tmp_path, *sweep)
    rows = first["members"]
    assert [r["state"] for r in rows] == ["trained", "trained"] and first["failed"] == []
    assert [r["overrides"] for r in rows] == [{"train.lr": 1e-3}, {"train.lr": 3e-3}]
    assert rows[0]["run"] != rows[1]["run"] and all(r["tokens"] == 4 * 1024 for r in rows)
    best = min(rows, key=lambda r: r["final_val_loss"])
    assert first["best"] == best["member"] and best["best"] and sum(r["best"] for r in rows) == 1
    assert all(r["device_hours"] > 0 for r in rows)
    assert first["bill"]["device_hours"] == pytest.approx(sum(r["device_hours"] for r in rows))

    # One data stage for both: one data config, prepared once (a data run of its own in MLflow), the
    # members' pipelines finding it cached.
    assert len(first["data"]) == 1 and first["data"][0]["cached"] is False and first["data"][0]["members"] == [1, 2]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'sweep' / 'root' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(resolve_config("smoke").tracking.experiment)
    assert len(client.search_runs([experiment.experiment_id], "tags.stage = 'data'")) == 1
    parent = client.get_run(first["mlflow_run_id"])
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"report.png", "sweep.json"}
    for r in rows:  # each member's pipeline run a child of the sweep's, its override a param
        child = client.get_run(r["mlflow_run_id"])
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert float(child.data.params["train.lr"]) == r["overrides"]["train.lr"]

    # Member 2 is exactly the run `gpt2 run` makes alone with its overrides, elsewhere.
    alone = _gpt2(env, tmp_path, "run", *SHORT, "--set", "train.lr=3e-3", *_on(tmp_path / "alone"))
    assert Path(alone["checkpoint"]).name == Path(rows[1]["checkpoint"]).name
    ours, theirs = _weights(rows[1]["checkpoint"]), _weights(alone["checkpoint"])
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)

    # The rerun: every member answered from its run, no attempt trained.
    attempts = sorted((tmp_path / "sweep" / "root" / "runs").glob("*/attempts/*.json"))
    again = _gpt2(env, tmp_path, *sweep)
    assert [r["state"] for r in again["members"]] == ["cached", "cached"]
    assert [r["final_val_loss"] for r in again["members"]] == [r["final_val_loss"] for r in rows]
    assert sorted((tmp_path / "sweep" / "root" / "runs").glob("*/attempts/*.json")) == attempts
