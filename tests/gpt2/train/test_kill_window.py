"""The time a SIGTERM leaves the trainer to checkpoint, per pool
(gpt2.process.kill_window.kill_window), and the warning before a run whose
checkpoint is expected not to fit it (the launcher, `gpt2 plan`)."""

from __future__ import annotations

import pytest

from gpt2.config.presets import gpt2_124m
from gpt2.cost.plan import CHECKPOINT_BYTES_PER_PARAM, make_plan, model_size
from gpt2.launch.torchrun import expected_save_warning
from gpt2.process import kill_window as preemption
from gpt2.process.kill_window import STOP_GRACE_S, kill_window


def _config(**runtime):
    config = gpt2_124m()
    return config.model_copy(update={"runtime": config.runtime.model_copy(update=runtime)})


def test_each_pool_bounds_the_window_by_its_own_limit(monkeypatch):
    monkeypatch.delenv(preemption.POOL_ENV, raising=False)
    assert kill_window(False) == kill_window(False, "process") and kill_window(False)[0] == STOP_GRACE_S
    assert kill_window(True)[0] == preemption.TORCHRUN_STOP_S
    # Kubernetes: prefect flow-run execute's 30 s, or the pod's grace when shorter.
    assert kill_window(False, "kubernetes")[0] == preemption.EXECUTE_STOP_S
    short = preemption.EXECUTE_STOP_S / 2
    assert kill_window(False, "kubernetes", grace_s=short) == (short, kill_window(False, "kubernetes", short)[1])
    assert "terminationGracePeriodSeconds" in kill_window(False, "kubernetes", grace_s=short)[1]
    assert kill_window(False, "gke-spot")[0] == preemption.GKE_SPOT_S
    assert kill_window(True, "gke-autopilot-spot")[0] == preemption.GKE_AUTOPILOT_SPOT_S
    assert kill_window(False, "vertex")[0] == min(preemption.EXECUTE_STOP_S, preemption.COMPUTE_PREEMPTION_S)
    # auto: what the pool's job template says.
    monkeypatch.setenv(preemption.POOL_ENV, "gke-spot")
    assert kill_window(False) == kill_window(False, "gke-spot")
    monkeypatch.setenv(preemption.POOL_ENV, "gke")
    with pytest.raises(ValueError, match="gke-spot"):
        kill_window(False)


def test_a_save_expected_to_outlast_the_window_warns_before_the_run_and_in_the_plan(monkeypatch):
    monkeypatch.delenv(preemption.POOL_ENV, raising=False)
    remote = {"root": "memory://bucket/gpt2"}
    config = _config(pool="gke-spot", **remote)
    size = model_size(config)[0] * CHECKPOINT_BYTES_PER_PARAM
    assert preemption.expected_save_s(size, remote_root=True) > preemption.GKE_SPOT_S  # gpt2-124m's 1.5 GB
    warning = expected_save_warning(config, 1)
    assert f"train.checkpoint_every={config.train.checkpoint_every}" in warning
    assert "shutdownGracePeriodSeconds" in warning  # what lengthens GKE's window
    plan = make_plan(config, "L4")
    assert plan["checkpoint_window_warning"] == warning
    assert plan["kill_window_s"] == preemption.GKE_SPOT_S and plan["pool"] == "gke-spot"
    # The same checkpoint fits the launcher's own window on a process pool.
    assert expected_save_warning(_config(pool="process", **remote), 1) is None
    assert make_plan(_config(pool="process", **remote), "L4")["checkpoint_window_warning"] is None


def test_a_save_that_outlasts_the_window_names_what_lengthens_it():
    slow = preemption.window_warning(10, 20.0, 5.0, kill_window(False, "gke-spot"))
    assert "train.checkpoint_every" in slow and "shutdownGracePeriodSeconds" in slow
    grace = preemption.window_warning(10, 20.0, 5.0, kill_window(False, "kubernetes", grace_s=10.0))
    assert "termination_grace_period_seconds" in grace
