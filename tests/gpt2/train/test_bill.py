"""The bill from attempt records: what is billed, what is redone, what a price makes of it."""

from __future__ import annotations

import pytest

from gpt2.train.bill import PIPELINE_METRICS, PREFIX, metrics, pipeline_bill, training_bill

HOUR, DAY = 3600.0, 86400.0


def attempt(n: int, start: float, wall: float, devices: int, resumed: int, step: int, end: str | None,
            startup: float | None, last_checkpoint: int | None = None) -> dict:
    return {"attempt": n, "started_at": start, "ended_at": start + wall if end else None,
            "heartbeat_at": start + wall, "devices": devices, "resumed_from": resumed, "step": step, "end": end,
            "startup_s": startup, "last_checkpoint": last_checkpoint, "step_s": wall / 2, "steps_timed": step - resumed}


def test_days_between_attempts_are_not_billed_and_redone_steps_are_counted_against_the_next_resume():
    devices, startup = 8, 60.0
    killed = attempt(1, 0.0, 2 * HOUR, devices, 0, 1700, "killed", startup, last_checkpoint=1500)
    done = attempt(2, 2 * HOUR + 3 * DAY, HOUR, devices, 1500, 2000, "done", startup, last_checkpoint=2000)
    bill = training_bill([killed, done], price_per_hour=None)
    assert bill["attempts"] == 2 and bill["ends"] == {"killed": 1, "done": 1}
    assert bill["device_hours"] == pytest.approx((2 + 1) * devices)
    assert bill["steps_redone"] == 1700 - 1500
    per_step_s = (2 * HOUR - startup) / 1700
    assert bill["device_hours_redone"] == pytest.approx(200 * per_step_s * devices / HOUR)
    assert bill["startup_s"] == pytest.approx(2 * startup)
    assert bill["cost"] is None
    assert PREFIX + "cost" not in metrics(bill)  # unknown, not zero


def test_cost_is_the_price_times_device_hours():
    records = [attempt(1, 0.0, 1.5 * HOUR, 4, 0, 10, "done", 5.0, 10)]
    bill = training_bill(records, price_per_hour=2.0)
    assert bill["cost"] == pytest.approx(2.0 * bill["device_hours"]) and bill["device_hours"] == pytest.approx(6.0)
    assert metrics(bill)[PREFIX + "cost"] == pytest.approx(bill["cost"])


def test_an_attempt_that_never_stepped_is_all_start_up_and_the_last_erroring_one_redoes_past_its_checkpoint():
    never = attempt(1, 0.0, 600.0, 1, 0, 0, "killed", None)
    never["step"] = None
    failed = attempt(2, 700.0, HOUR, 1, 0, 30, "error", 10.0, last_checkpoint=20)
    bill = training_bill([never, failed], None)
    assert bill["startup_s"] == pytest.approx(600.0 + 10.0)
    assert bill["steps_redone"] == 10


def test_the_pipeline_adds_the_cpu_stages_at_their_own_price():
    train = training_bill([attempt(1, 0.0, HOUR, 8, 0, 10, "done", 1.0, 10)], 3.0)
    total = pipeline_bill(train, cpu_hours=2.0, gpu_stage_hours=0.5, price_per_hour=3.0, cpu_price_per_hour=0.25)
    assert total["device_hours"] == pytest.approx(8.5)
    assert total["cost"] == pytest.approx(3.0 * 8.5 + 0.25 * 2.0)
    assert pipeline_bill(train, 2.0, 0.5, None, None)["cost"] is None
    assert set(metrics(total, PIPELINE_METRICS)) == {PREFIX + k for k in PIPELINE_METRICS}


def test_a_start_that_never_trained_a_step_is_device_time_not_an_attempt():
    """An attempt that erred (or was stopped) before its first step held the
    device: its time is billed, but it is not counted as a training attempt."""
    failed = attempt(1, 0.0, 90.0, 8, 0, 0, "error", None)
    failed.update(step=0, first_step_at=None)
    resumed_then_stopped = attempt(2, 100.0, 30.0, 8, 0, 0, "preempted", None)
    resumed_then_stopped.update(resumed_from=20, step=20, first_step_at=None)
    done = attempt(3, 200.0, HOUR, 8, 20, 40, "done", 12.0, last_checkpoint=40)
    bill = training_bill([failed, resumed_then_stopped, done], price_per_hour=2.0)
    assert bill["attempts"] == 1
    assert bill["ends"] == {"error": 1, "preempted": 1, "done": 1}  # how every start ended
    assert bill["device_hours"] == pytest.approx((90.0 + 30.0 + HOUR) * 8 / HOUR)
    assert bill["startup_s"] == pytest.approx(90.0 + 30.0 + 12.0)
    assert bill["cost"] == pytest.approx(2.0 * bill["device_hours"])
    # A first step on record counts even when no later step or heartbeat was written.
    killed = attempt(4, 5000.0, 5.0, 8, 40, 40, "killed", 3.0)
    killed["first_step_at"] = 5003.0
    assert training_bill([killed], None)["attempts"] == 1
