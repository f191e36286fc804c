"""The short fault soak, as CI runs it: a handful of faults drawn from a
seed against one smoke pipeline on a stack of its own (bench/chaos.py), with
the durations shrunk so it fits the end-to-end tier. It passes only when the
pipeline completed with nothing lost, nothing duplicated and no other
problem; the long soak (>= 50 faults) is run by hand (docs/fault-soak.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_short_soak_loses_and_duplicates_nothing(tmp_path):
    cmd = [sys.executable, "-m", "bench.chaos", "--seed", "11", "--faults", "4", "--per-pipeline", "4",
           "--window-s", "15,150", "--pause-s", "5,15", "--mlflow-away-s", "40", "--disk-full-s", "10",
           "--dir", str(tmp_path / "soak"), "--figure", str(tmp_path / "soak.png"), "--json"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=2400)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    summary = {k: v for k, v in result.items() if k != "details"}
    findings = [f for p in result["details"] for f in p["lost"] + p["duplicates"] + p["problems"]]
    assert done.returncode == 0, f"{summary}\n{findings}\n{done.stderr[-4000:]}"
    assert result["faults_total"] == 4 and sum(result["faults"].values()) == 4
    assert result["pipelines"] >= 1 and result["pipelines_completed"] == result["pipelines"]
    assert result["lost"] == 0 and result["duplicates"] == 0 and result["problems"] == 0
    assert (tmp_path / "soak.png").stat().st_size > 0


def test_server_restart_mlflow_away_and_a_frozen_flow_run_during_training(tmp_path):
    """The soak's questions at the moments that test them, after the first
    trainer started (its 200 steps take about a minute): the Prefect server
    SIGKILLed (the supervisor restarts it 5 s later), MLflow away for a
    minute, then the training flow run's machine frozen for 150 s: past the zombie automation's 90 s, so the run is marked
    Crashed, rescheduled (by the parent where the restarted server's
    automation misses it: flows.stages.reschedule_in_its_place) and resumed,
    while the frozen trainer, when it thaws, stops without writing over it."""
    cmd = [sys.executable, "-m", "bench.chaos", "--seed", "3",
           "--script", "kill:server@3,mlflow-away@10,pause:train-run@20", "--pause-s", "150,150",
           "--mlflow-away-s", "60", "--dir", str(tmp_path / "soak"), "--json"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=2400)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    summary = {k: v for k, v in result.items() if k != "details"}
    findings = [f for p in result["details"] for f in p["lost"] + p["duplicates"] + p["problems"]]
    assert done.returncode == 0, f"{summary}\n{findings}\n{done.stderr[-4000:]}"
    assert result["faults"] == {"kill:server": 1, "mlflow-away": 1, "pause:train-run": 1}
    assert result["restarts"].get("server") == 1 and result["restarts"].get("mlflow") == 1
