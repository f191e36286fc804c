"""Every training attempt leaves a record in the run directory, and the bill
counts them: killed (SIGKILL) and preempted (SIGTERM) attempts exactly, the
steps trained twice, the price, never the time between attempts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt2 import layout, storage
from gpt2.bill import PREFIX
from gpt2.train.attempts import read_attempts
from gpt2.train.run import PREEMPTED_EXIT_CODE, train
from tests.gpt2.train.fixtures import tiny_config, write_dataset, write_run_json

REPO = Path(__file__).resolve().parents[3]

# Trains in its own process and sends itself SIGNAL once step STEP is reported:
# SIGKILL leaves no chance to write anything, SIGTERM is the preemption notice.
SIGNAL_AT_STEP = """
import os, signal, sys
import gpt2.train.__main__ as entry

config_path, sig, at = sys.argv[1], getattr(signal, sys.argv[2]), int(sys.argv[3])
original = entry.train

def train(config, progress=None, **kw):
    def report(info):
        if progress is not None:
            progress(info)
        if info.step == at:
            os.kill(os.getpid(), sig)
    return original(config, progress=report, **kw)

entry.train = train
sys.exit(entry.main(["--config", config_path]))
"""


def _signal_at(config, tmp: Path, sig: str, step: int) -> tuple[int, str]:
    script = tmp / "signal_at.py"
    script.write_text(SIGNAL_AT_STEP)
    run_json = write_run_json(config, tmp / f"run-{sig}.json")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, str(script), str(run_json), sig, str(step)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr


def _resumed_from(log: str) -> int:
    """The step the trainer says it resumed from (0: it started afresh)."""
    found = re.search(r"resuming from \S+ \(step (\d+)\)", log)
    return int(found.group(1)) if found else 0


def test_sigkill_and_sigterm_attempts_are_counted_exactly_with_the_steps_redone(tmp_path):
    config = tiny_config(tmp_path, **{"runtime.heartbeat_s": 0})  # every step's progress is recorded
    write_dataset(config)
    every, last = config.train.checkpoint_every, config.train.max_steps
    killed_at = every + 1  # one step past a checkpoint
    code, _ = _signal_at(config, tmp_path, "SIGKILL", killed_at)
    assert code == -signal.SIGKILL
    stopped_at = killed_at + every
    assert stopped_at < last
    code, log = _signal_at(config, tmp_path, "SIGTERM", stopped_at)
    assert code == PREEMPTED_EXIT_CODE, log[-3000:]
    # The checkpoint the next attempt started from: in the root, or the local copy the kill left un-uploaded.
    resume_point = _resumed_from(log)
    assert resume_point <= killed_at
    result = train(config)

    records = read_attempts(layout.run_dir(config))
    assert [r["end"] for r in records] == ["killed", "preempted", "done"]
    assert [r["attempt"] for r in records] == [1, 2, 3]
    assert records[0]["step"] == killed_at and records[0]["closed_by"] == 2
    assert records[1]["resumed_from"] == resume_point and records[1]["step"] == stopped_at
    assert records[2]["resumed_from"] == stopped_at and records[2]["step"] == last
    # The killed attempt is billed to its last sign of life, not to the next start.
    assert records[0]["ended_at"] <= records[1]["started_at"]
    bill = result.bill
    assert bill["attempts"] == 3
    assert bill["ends"] == {"killed": 1, "preempted": 1, "done": 1}
    assert bill["steps_redone"] == killed_at - resume_point  # trained after the last checkpoint, then again
    assert bill["device_hours_redone"] > 0
    assert bill["startup_s"] == pytest.approx(sum(r["startup_s"] for r in records))
    assert bill["cost"] is None  # no runtime.price_per_hour


def test_cost_is_price_times_device_hours_and_lands_on_the_mlflow_run(tmp_path):
    from mlflow import MlflowClient

    from gpt2.tracking import default_tracking_uri

    price = 2.5
    config = tiny_config(tmp_path, **{"runtime.price_per_hour": price})
    write_dataset(config)
    result = train(config)
    bill = result.bill
    assert bill["attempts"] == 1 and bill["ends"] == {"done": 1}
    assert bill["device_hours"] > 0
    assert bill["cost"] == pytest.approx(price * bill["device_hours"])
    (record,) = read_attempts(layout.run_dir(config))
    assert bill["device_hours"] == pytest.approx((record["ended_at"] - record["started_at"]) * record["devices"] / 3600)
    logged = MlflowClient(default_tracking_uri(config)).get_run(result.mlflow_run_id).data.metrics
    assert logged[PREFIX + "cost"] == pytest.approx(bill["cost"])
    assert logged[PREFIX + "attempts"] == 1
    assert logged[PREFIX + "steps_redone"] == 0
    assert bill["data_wait_s"] == pytest.approx(record["data_wait_s"])
    assert logged[PREFIX + "data_wait_s"] == pytest.approx(bill["data_wait_s"])


def test_a_rerun_of_a_finished_run_adds_no_attempt(tmp_path):
    config = tiny_config(tmp_path)
    write_dataset(config)
    first = train(config)
    again = train(config)
    assert again.steps == first.steps == config.train.max_steps
    assert len(read_attempts(layout.run_dir(config))) == 1
    assert again.bill["attempts"] == 1
    assert again.bill["device_hours"] == pytest.approx(first.bill["device_hours"])


def test_a_gap_of_days_before_the_next_attempt_is_not_billed(tmp_path):
    """An attempt killed days ago, injected as its record: the next attempt
    closes it at its last heartbeat and bills only the time it ran."""
    config = tiny_config(tmp_path)
    write_dataset(config)
    run_dir = layout.run_dir(config)
    ran_s, days_ago = 1800.0, 3 * 86400.0
    started = time.time() - days_ago
    storage.write_record(layout.attempt_record(run_dir, 1), {
        "attempt": 1, "host": "gone", "pid": 1, "device_type": "cuda", "device_name": "gone", "devices": 8,
        "lease_generation": None, "started_at": started, "resumed_from": 0, "step": 0, "first_step_at": None,
        "startup_s": None, "step_s": 0.0, "steps_timed": 0, "mfu": None, "heartbeat_at": started + ran_s,
        "ended_at": None, "end": None, "last_checkpoint": None, "message": None, "closed_by": None})
    result = train(config)
    first, second = read_attempts(run_dir)
    assert first["end"] == "killed" and first["ended_at"] == started + ran_s and first["closed_by"] == 2
    mine = (second["ended_at"] - second["started_at"]) * second["devices"] / 3600
    assert result.bill["device_hours"] == pytest.approx(ran_s * first["devices"] / 3600 + mine)
    assert result.bill["device_hours"] < days_ago / 3600  # the days in between are nobody's device time


class Boom(RuntimeError):
    pass


def test_an_attempt_that_fails_says_so_and_its_steps_past_the_checkpoint_are_redone(tmp_path):
    config = tiny_config(tmp_path)
    write_dataset(config)
    failed_at = config.train.checkpoint_every + 1

    def fail(info) -> None:
        if info.step == failed_at:
            raise Boom(f"failed at step {info.step}")

    with pytest.raises(Boom):
        train(config, progress=fail)
    result = train(config)
    first, second = read_attempts(layout.run_dir(config))
    assert first["end"] == "error" and "Boom: failed at step" in first["message"]
    assert first["step"] == failed_at
    assert result.bill["ends"] == {"error": 1, "done": 1}
    assert result.bill["steps_redone"] == failed_at - second["resumed_from"]
    assert second["resumed_from"] == result.resumed_from_step < failed_at
