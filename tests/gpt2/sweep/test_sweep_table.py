"""The sweep's table and bill: rows from the members' pipeline summaries, the best marked, a
failure with its one-line reason, and the bill by pool from attempt records the test writes."""

from __future__ import annotations

import pytest

from gpt2.root import layout, storage
from gpt2.sweep.members import resolve_members
from gpt2.sweep.table import describe, mark_best, member_bill, member_row, sweep_bill


def _record(n: int, started: float, hours: float, devices: int, pool: str, price: float | None, step: int) -> dict:
    return {"attempt": n, "started_at": started, "ended_at": started + hours * 3600, "devices": devices,
            "first_step_at": started + 1, "resumed_from": 0 if n == 1 else 10, "step": step, "end": "done",
            "pool": pool, "price_per_hour": price}


@pytest.fixture
def members(tmp_path):
    sets = [{"train.lr": 1e-3}, {"train.lr": 2e-3}, {"train.lr": 3e-3}]
    return resolve_members("smoke", {"runtime.price_per_hour": 2.0}, sets, root=str(tmp_path))


def _summary(member, loss, acc, steps, cached=()):
    ckpt = layout.checkpoint_dir(member.run_dir, steps)
    return {"final_val_loss": loss, "hellaswag": {"acc_norm": acc, "n": 10}, "checkpoint": ckpt,
            "cached_stages": list(cached), "mlflow_run_id": f"parent-{member.index}",
            "stage_mlflow_run_ids": {"train": f"train-{member.index}"}}


def test_rows_best_failures_and_the_bill_by_pool(members):
    one, two, three = members
    # Member 1: preempted on the spot pool (priced by its record), finished on `gpu` (the run's price).
    storage.write_record(layout.attempt_record(one.run_dir, 1), _record(1, 1000.0, 0.5, 2, "gpu-spot", 1.0, 10))
    storage.write_record(layout.attempt_record(one.run_dir, 2), _record(2, 9000.0, 0.25, 2, "gpu", None, 20))
    storage.write_record(layout.attempt_record(two.run_dir, 1), _record(1, 1000.0, 1.0, 1, "gpu", None, 20))
    bills = [member_bill(m) for m in members]
    assert bills[0]["device_hours"] == pytest.approx(1.5) and bills[0]["cost"] == pytest.approx(1.0 + 1.0)
    assert bills[2]["device_hours"] == 0 and bills[2]["cost"] == 0  # failed before its first attempt

    rows = [member_row(one, _summary(one, 3.5, 0.26, 20), None, bills[0]),
            member_row(two, _summary(two, 3.25, 0.3, 20, cached=("data", "train")), None, bills[1]),
            member_row(three, None, "StageFailed: stage train ended Failed: loss spike\nTraceback…", bills[2])]
    assert [r["state"] for r in rows] == ["trained", "cached", "failed"]
    assert rows[0]["tokens"] == 20 * one.config.train.total_batch_tokens
    assert rows[2]["reason"] == "StageFailed: stage train ended Failed: loss spike"  # one line
    assert mark_best(rows) is rows[1] and [r["best"] for r in rows] == [False, True, False]

    bill = sweep_bill(rows)
    assert bill["device_hours"] == pytest.approx(2.5) and bill["cost"] == pytest.approx(2.0 + 2.0)
    assert bill["pools"]["gpu-spot"] == {"attempts": 1, "device_hours": pytest.approx(1.0), "cost": pytest.approx(1.0)}
    assert bill["pools"]["gpu"] == {"attempts": 2, "device_hours": pytest.approx(1.5), "cost": pytest.approx(3.0)}

    text = describe(rows, bill).splitlines()
    assert text[2].startswith("*") and "3.2500" in text[2] and "train.lr=0.002" in text[2]
    assert "member 3 failed: StageFailed: stage train ended Failed: loss spike" in text
    assert text[-3].startswith("bill: 3 member(s), 2.5000 device-hours, cost 4.00")


def test_an_unpriced_member_leaves_the_sweep_cost_unknown(tmp_path):
    (one,) = resolve_members("smoke", {}, [{"train.lr": 1e-3}], root=str(tmp_path))
    storage.write_record(layout.attempt_record(one.run_dir, 1), _record(1, 0.0, 1.0, 1, "gpu", None, 20))
    row = member_row(one, _summary(one, 3.0, None, 20), None, member_bill(one))
    assert row["cost"] is None and sweep_bill([row])["cost"] is None
    assert "cost unknown (set runtime.price_per_hour)" in describe([row], sweep_bill([row]))


def test_a_core_column_only_when_a_member_was_scored_on_core(members):
    one, two, _ = members
    scored = {**_summary(one, 3.0, 0.3, 20), "core": {"score": 0.1139}}
    rows = [member_row(one, scored, None, None), member_row(two, _summary(two, 3.1, 0.3, 20), None, None)]
    assert [r["core"] for r in rows] == [0.1139, None]
    head, first, second = describe(rows, sweep_bill(rows)).splitlines()[:3]
    assert "CORE" in head and "0.1139" in first and " - " in second
    rows[0]["core"] = None
    assert "CORE" not in describe(rows, sweep_bill(rows)).splitlines()[0]


def test_no_best_when_every_member_failed(members):
    rows = [member_row(m, None, "boom", None) for m in members]
    assert mark_best(rows) is None and not any(r["best"] for r in rows)


def test_the_members_link_filters_the_runs_table_to_the_sweeps_children():
    from urllib.parse import unquote

    from gpt2.tracking.experiment import children_link

    link = children_link("http://mlflow:5000", "7", "abc123")
    assert link.startswith("http://mlflow:5000/#/experiments/7/runs?workflowType=machine_learning&searchFilter=")
    assert unquote(link.split("searchFilter=")[1]) == "tags.`mlflow.parentRunId` = 'abc123'"
    assert children_link("file:///x", "7", "abc123") == "file:///x"  # no UI to link to
