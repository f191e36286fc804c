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

from gpt2.root import layout, storage
from gpt2.train.attempts import read_attempts
from gpt2.train.bill import PREFIX
from gpt2.train.run import PREEMPTED_EXIT_CODE, train
from tests.gpt2.train.fixtures import tiny_config, write_dataset, write_run_json
from tests.tiers import scenario

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


@scenario
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

    from gpt2.tracking.store import default_tracking_uri

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


def test_the_first_step_and_each_checkpoint_step_are_recorded_at_once_whatever_the_heartbeat(tmp_path):
    """A trainer SIGKILLed seconds after its first step, before any heartbeat,
    still left the step on disk: the bill counts it as an attempt that trained.
    A checkpoint's step is written at once too (where the next attempt resumes);
    this machine keeps every step's progress for a later attempt here."""
    import json

    from gpt2.train.attempts import Attempt
    from gpt2.train.bill import training_bill
    from gpt2.train.progress import StepInfo

    config = tiny_config(tmp_path, **{"runtime.heartbeat_s": 3600})  # checkpoint_every=2
    run_dir = layout.run_dir(config)
    url = layout.attempt_record(run_dir, 1)
    record = {"attempt": 1, "host": "here", "pid": os.getpid(), "started_at": time.time(), "devices": 1,
              "resumed_from": None, "step": None, "first_step_at": None, "startup_s": None, "step_s": 0.0,
              "steps_timed": 0, "mfu": None, "data_wait_s": 0.0, "heartbeat_at": time.time(), "ended_at": None,
              "end": None}
    storage.create_exclusive(url, json.dumps(record).encode())
    attempt = Attempt(config, record=record)
    attempt.url = url
    attempt.resumed(4, 10)
    report = attempt.progress(None)

    def step(n: int) -> None:
        report(StepInfo(step=n, max_steps=10, loss=3.0, lr=1e-3, grad_norm=1.0, tokens_per_second=1000.0, mfu=None,
                        eta_seconds=None))

    step(5)
    (on_disk,) = read_attempts(run_dir)  # what a killed trainer leaves: no end, no later write
    assert on_disk["step"] == 5 and on_disk["first_step_at"] is not None and on_disk["end"] is None
    step(7)
    assert read_attempts(run_dir)[0]["step"] == 5  # later steps wait for the heartbeat, as before
    kept = json.loads((layout.attempt_progress_dir(config) / "000001.json").read_text())
    assert kept["step"] == 7  # on this machine: every step
    step(8)
    assert read_attempts(run_dir)[0]["step"] == 8  # a checkpoint's step: at once
    assert training_bill(read_attempts(run_dir), None)["attempts"] == 1


@scenario
def test_a_trainer_killed_between_heartbeats_is_billed_the_steps_its_log_shows(tmp_path):
    """SIGKILL three steps past a checkpoint, long before the next heartbeat
    (runtime.heartbeat_s=3600): the next attempt on this machine reads the
    killed one's own per-step progress, so the bill redoes exactly those steps."""
    config = tiny_config(tmp_path, **{"runtime.heartbeat_s": 3600, "train.checkpoint_every": 4})
    write_dataset(config)
    killed_at = 7  # three steps past the checkpoint of step 4
    code, _ = _signal_at(config, tmp_path, "SIGKILL", killed_at)
    assert code == -signal.SIGKILL
    result = train(config)
    killed, done = read_attempts(layout.run_dir(config))
    assert killed["end"] == "killed" and killed["step"] == killed_at
    assert done["resumed_from"] == 4
    assert result.bill["steps_redone"] == killed_at - done["resumed_from"] == 3
    assert killed["ended_at"] >= killed["heartbeat_at"]  # billed to its last step, not to its last heartbeat


def test_a_start_that_fails_before_its_first_step_lets_go_and_is_not_billed_as_an_attempt(tmp_path):
    """The newcomer's case: a trainer that fails before its first step (here a
    micro-batch that does not divide the step) releases its lease, so the next
    good run starts at once, and the bill counts one attempt, with the failed
    start's device time still in it."""
    from gpt2.train.session import TrainingError

    config = tiny_config(tmp_path, **{"train.micro_batch_size": 3})  # 8 sequences a step: no divisor
    write_dataset(config)
    with pytest.raises(TrainingError, match="micro_batch_size=3 does not divide"):
        train(config)
    good = tiny_config(tmp_path)
    assert layout.run_name(good) == layout.run_name(config)  # the same run: the micro-batch is not its identity
    result = train(good)
    records = read_attempts(layout.run_dir(good))
    assert [r["end"] for r in records] == ["error", "done"] and records[0]["first_step_at"] is None
    assert result.bill["attempts"] == 1 and result.bill["ends"] == {"error": 1, "done": 1}
    walls = [r["ended_at"] - r["started_at"] for r in records]
    assert result.bill["device_hours"] == pytest.approx(sum(walls) / 3600)


def test_an_attempt_records_its_pool_its_price_and_its_progress(tmp_path):
    """The pool comes from the flow run's tags (tasks.tracking.flow_run_tags), its
    price from the ladder (runtime.gpu_pools); the parent's progress line reads the record."""
    from flows.child_progress import describe

    config = tiny_config(tmp_path, **{"runtime.gpu_pools": "gpu-spot:1.5,gpu:4.0", "runtime.price_per_hour": 9.0})
    write_dataset(config)
    result = train(config, tags={"prefect.work_pool": "gpu-spot"})
    (record,) = read_attempts(layout.run_dir(config))
    assert record["pool"] == "gpu-spot" and record["price_per_hour"] == 1.5
    assert result.bill["pools"]["gpu-spot"]["cost"] == pytest.approx(1.5 * result.bill["device_hours"])
    assert result.bill["cost"] == pytest.approx(1.5 * result.bill["device_hours"])  # not the run's 9.0
    line = describe(record)
    assert line.startswith(f"train: step {config.train.max_steps}/{config.train.max_steps}, loss ")
    assert line.endswith("(done) (pool gpu-spot)")
