"""`gpt2 plan --grid/--runs`: a sweep priced as its members' plans added up at the parallelism,
the one-run plan's keys kept; a bad member refused by number and key before anything is planned."""

from __future__ import annotations

import json

import pytest

from gpt2.report.figures_on_record import RESULTS_ENV
from tests.cli.plan_process import gpt2_plan


def _plan(tmp_path, *args):
    done = gpt2_plan(tmp_path, "--preset", "gpt2-124m", "--gpu", "H100", "--gpus", "8", *args,
                     env={RESULTS_ENV: str(tmp_path / "no-records.jsonl")})
    return done


def test_a_grid_is_priced_member_by_member_at_the_parallelism(tmp_path):
    (tmp_path / "runs.yaml").write_text("- {train.max_steps: 1000}\n- {train.max_steps: 3000}\n")
    args = ("--price-per-hour", "24", "--runs", str(tmp_path / "runs.yaml"), "--grid", "train.lr=6e-4,1.2e-3",
            "--set", "runtime.max_parallel_runs=2", "--json")
    done = _plan(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    p = json.loads(done.stdout.strip().splitlines()[-1])
    one = json.loads(_plan(tmp_path, "--price-per-hour", "24", "--json").stdout.strip().splitlines()[-1])
    assert set(one) <= set(p) and p["steps"] == one["steps"]  # the preset's own plan, every key kept
    sweep = p["sweep"]
    assert [m["overrides"] for m in sweep["members"]] == [
        "train.max_steps=1000 train.lr=0.0006", "train.max_steps=1000 train.lr=0.0012",
        "train.max_steps=3000 train.lr=0.0006", "train.max_steps=3000 train.lr=0.0012"]
    hours = [m["hours"] for m in sweep["members"]]
    assert hours[2] == pytest.approx(3 * hours[0], rel=0.01)  # the same tokens per step, three times the steps
    assert sweep["parallel"] == 2 and sweep["wall_hours"] == pytest.approx(hours[0] + hours[2])
    assert sweep["gpu_hours"] == pytest.approx(8 * sum(hours))
    assert sweep["cost"] == pytest.approx(24 * sum(hours))


def test_a_bad_member_is_refused_naming_member_and_key(tmp_path):
    done = _plan(tmp_path, "--grid", "train.lr=6e-4,-1")
    assert done.returncode == 2
    assert "error: member 2 (train.lr=-1): train.lr:" in done.stderr
    assert "member 1" not in done.stderr
