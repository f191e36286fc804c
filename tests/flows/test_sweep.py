"""`gpt2 sweep` end to end on Prefect's temporary server, as a user runs it: a smoke sweep from a
runs file trains two members on one data stage while a third fails in its train stage (the sweep
exits 1 naming it), nests their pipeline runs under the sweep's MLflow
run with report.png beside the table; a member equals the same run made alone by `gpt2 run` on
another root, bit for bit on CPU; the rerun answers every finished member from its run, training
nothing."""

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


def _gpt2(env: dict, cwd: Path, *args: str, code: int = 0) -> dict:
    done = subprocess.run([sys.executable, "-m", "cli.main", *args, "--json"], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == code, f"gpt2 {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}"
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
    # Member 3 passes every check before the start and fails in its train stage (its memory cannot
    # hold the model): its failure is its own, the others finish, the sweep exits 1.
    (tmp_path / "runs.yaml").write_text("- {train.lr: 1.0e-3}\n- {train.lr: 3.0e-3}\n"
                                        "- {train.lr: 5.0e-3, runtime.memory_limit_mb: 1}\n")
    sweep = ("sweep", *SHORT, "--runs", str(tmp_path / "runs.yaml"), *_on(tmp_path / "sweep"))
    first = _gpt2(env, tmp_path, *sweep, code=1)
    rows, failed = first["members"][:2], first["members"][2]
    assert [r["state"] for r in rows] == ["trained", "trained"] and first["failed"] == [3]
    assert failed["state"] == "failed" and "runtime.memory_limit_mb=1" in failed["reason"]
    assert "\n" not in failed["reason"] and failed["final_val_loss"] is None and not failed["best"]
    assert [r["overrides"] for r in rows] == [{"train.lr": 1e-3}, {"train.lr": 3e-3}]
    assert rows[0]["run"] != rows[1]["run"] and all(r["tokens"] == 4 * 1024 for r in rows)
    best = min(rows, key=lambda r: r["final_val_loss"])
    assert first["best"] == best["member"] and best["best"] and sum(r["best"] for r in rows) == 1
    assert all(r["device_hours"] > 0 for r in rows)
    assert first["bill"]["device_hours"] == pytest.approx(sum(r["device_hours"] for r in first["members"]))

    # One data stage for both: one data config, prepared once (a data run of its own in MLflow), the
    # members' pipelines finding it cached.
    assert len(first["data"]) == 1 and first["data"][0]["cached"] is False and first["data"][0]["members"] == [1, 2, 3]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'sweep' / 'root' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(resolve_config("smoke").tracking.experiment)
    assert len(client.search_runs([experiment.experiment_id], "tags.stage = 'data'")) == 1
    parent = client.get_run(first["mlflow_run_id"])
    assert first["mlflow_members_url"].endswith(f"%27{parent.info.run_id}%27")  # the table of its children
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
    runs = tmp_path / "sweep" / "root" / "runs"
    attempts = sorted(a for r in rows for a in (runs / r["run"]).glob("attempts/*.json"))
    again = _gpt2(env, tmp_path, *sweep, code=1)
    assert [r["state"] for r in again["members"]] == ["cached", "cached", "failed"]
    assert [r["final_val_loss"] for r in again["members"][:2]] == [r["final_val_loss"] for r in rows]
    assert sorted(a for r in rows for a in (runs / r["run"]).glob("attempts/*.json")) == attempts
