"""`gpt2 plan --run`: the estimate beside what a trained run measured, from
its attempt records; the real command in a subprocess, on a run trained here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpt2.cost.actual import ROWS
from gpt2.root import layout
from gpt2.train.attempts import read_attempts
from gpt2.train.run import train
from tests.cli.plan_process import gpt2_plan
from tests.cli.test_plan_command import REQUIRED
from tests.gpt2.train.fixtures import tiny_config, write_dataset

# One pytest worker runs this module (--dist loadgroup): its module-scoped fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("plan_actual")

PRICE = 2.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    config = tiny_config(root)
    write_dataset(config)
    train(config)
    return root, config


def _plan(root: Path, *args: str) -> subprocess.CompletedProcess:
    return gpt2_plan(root, "--gpu", "H100", *args)


def test_the_estimate_beside_the_measured_run(trained):
    root, config = trained
    out = _plan(root, "--run", layout.run_name(config), "--set", f"runtime.price_per_hour={PRICE}", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout.strip().splitlines()[-1])
    assert REQUIRED <= set(plan)  # every key of a plain `gpt2 plan --json` stays
    assert plan["steps"] == config.train.max_steps  # planned with the run's own settings
    actual = plan["actual"]
    assert set(actual["rows"]) == set(ROWS)
    (record,) = read_attempts(layout.run_dir(config))
    rows = actual["rows"]
    assert rows["attempts"] == {"estimate": 1, "measured": 1}
    assert rows["device_hours"]["measured"] == pytest.approx(
        (record["ended_at"] - record["started_at"]) * record["devices"] / 3600)
    assert rows["cost"]["measured"] == pytest.approx(PRICE * rows["device_hours"]["measured"])
    assert rows["cost"]["estimate"] == pytest.approx(PRICE * plan["gpu_hours"])
    assert rows["steps_per_second"]["measured"] == pytest.approx(record["steps_timed"] / record["step_s"])
    assert rows["steps_per_second"]["estimate"] == pytest.approx(plan["tokens_per_second"] / plan["total_batch_tokens"])
    assert actual["steps_trained"] == config.train.max_steps and actual["devices"] == [record["devices"]]

    text = _plan(root, "--run", layout.run_name(config))
    assert text.returncode == 0, text.stderr
    for expected in ("estimate", "measured", "steps/s", "MFU", "device-hours", "attempts", "runtime.price_per_hour"):
        assert expected in text.stdout


def test_an_unknown_run_is_named_with_where_runs_are(trained):
    root, _ = trained
    out = _plan(root, "--run", "no-such-run")
    assert out.returncode != 0
    assert "no-such-run" in out.stderr + out.stdout and "runs" in out.stderr + out.stdout


def test_a_plain_plan_has_no_measured_part_before_its_run_trained(tmp_path):
    out = _plan(tmp_path, "--preset", "smoke", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["actual"] is None
