"""A sweep priced before it runs: members x the plan, the wall time at the parallelism."""

from __future__ import annotations

import pytest

from gpt2.sweep.plan import price_sweep, queued_hours


def test_members_queue_on_the_slots_in_order():
    assert queued_hours([1.0, 1.0, 1.0, 1.0], 1) == 4.0
    assert queued_hours([1.0, 1.0, 1.0, 1.0], 2) == 2.0
    assert queued_hours([3.0, 1.0, 1.0], 2) == 3.0  # the long one holds a slot, the others share the other
    assert queued_hours([1.0, 2.0], 8) == 2.0
    with pytest.raises(ValueError):
        queued_hours([1.0], 0)


def test_the_sweep_adds_up_its_members_plans():
    plans = [{"steps": 10, "hours": 2.0, "gpu_hours": 16.0, "cost": 50.0},
             {"steps": 20, "hours": 4.0, "gpu_hours": 32.0, "cost": 100.0}]
    sweep = price_sweep(["train.lr=1", "train.lr=2"], plans, 1)
    assert sweep["gpu_hours"] == 48.0 and sweep["cost"] == 150.0 and sweep["wall_hours"] == 6.0
    assert sweep["members"][1] == {"member": 2, "overrides": "train.lr=2", "steps": 20, "hours": 4.0,
                                   "gpu_hours": 32.0, "cost": 100.0}
    assert price_sweep(["a", "b"], plans, 2)["wall_hours"] == 4.0
    assert price_sweep(["a", "b"], [plans[0], {**plans[1], "cost": None}], 2)["cost"] is None
