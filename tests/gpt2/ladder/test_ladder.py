"""The ladder of GPU pools' decisions (gpt2.ladder) on state histories as
Prefect records them, its config key, and the bill per pool."""

from __future__ import annotations

import pytest

from gpt2.config.overrides import ConfigError, resolve_config
from gpt2.config.runtime import GpuPool
from gpt2.ladder import moves, rungs
from gpt2.train import bill

SPOT = GpuPool(pool="gpu-spot", price_per_hour=1.0, start_timeout_s=600, max_preemptions=2)


def states(*spec: tuple[str, float], name: str = "") -> list[moves.State]:
    return [moves.State(t, name or t.title(), at) for t, at in spec]


def decide(history, rung=SPOT, last=False, now=1000.0, stage_timeout=3600.0, grace=120.0):
    return moves.verdict(history, rung, last, now, stage_timeout, grace)


def test_a_run_that_waits_past_its_rungs_start_timeout_leaves_it():
    waiting = states(("SCHEDULED", 0.0), ("SCHEDULED", 300.0))  # Scheduled, then Late: the clock is the first
    assert decide(waiting, now=599.0).action == "wait"
    left = decide(waiting, now=601.0)
    assert left.action == "leave" and left.why == "gpu-spot: not started within 600 s (Scheduled)"


def test_on_the_last_rung_the_stage_start_timeout_applies_and_fails_the_stage():
    waiting = states(("SCHEDULED", 0.0))
    assert decide(waiting, last=True, now=3000.0).action == "wait"
    failed = decide(waiting, last=True, now=3700.0)
    assert failed.action == "failed" and "not started within 3600 s" in failed.why


def test_a_pending_run_counts_as_waiting_a_running_one_does_not():
    assert decide(states(("SCHEDULED", 0.0), ("PENDING", 500.0)), now=700.0).action == "leave"
    assert decide(states(("SCHEDULED", 0.0), ("PENDING", 500.0), ("RUNNING", 550.0)), now=5000.0).action == "wait"


def test_a_job_that_crashed_before_the_flow_ran_leaves_at_once():
    crashed = [*states(("SCHEDULED", 0.0), ("PENDING", 5.0)),
               moves.State("CRASHED", "Crashed", 9.0, "Flow run infrastructure exited with non-zero status code 1")]
    left = decide(crashed, now=10.0)
    assert left.action == "leave" and "crashed before the flow ran" in left.why and "status code 1" in left.why


def test_on_the_last_rung_a_job_that_crashed_before_the_flow_ran_is_given_the_grace():
    """Where there is no rung below, the backstops may start it again (its process
    started while the Prefect server was away: flows.reschedule.unstarted_crashes);
    failing the stage at once would leave that new attempt without its pipeline."""
    crashed = [*states(("SCHEDULED", 0.0), ("PENDING", 5.0)),
               moves.State("CRASHED", "Crashed", 9.0, "Flow run infrastructure exited with non-zero status code 1")]
    assert decide(crashed, last=True, now=60.0).action == "wait"
    again = crashed + states(("SCHEDULED", 45.0), ("PENDING", 50.0), ("RUNNING", 55.0))
    assert decide(again, last=True, now=60.0).action == "wait"
    failed = decide(crashed, last=True, now=130.0)
    assert failed.action == "failed" and "crashed before the flow ran" in failed.why


def test_preemptions_are_counted_from_the_history_and_leave_at_the_rungs_cap():
    once = states(("SCHEDULED", 0), ("PENDING", 1), ("RUNNING", 2), ("CRASHED", 50), ("SCHEDULED", 70))
    assert moves.preemptions(once) == 1
    assert decide(once, now=80.0).action == "wait"  # rescheduled: waits for its machine again
    # The second preemption through `prefect flow-run execute` (Running -> AwaitingRetry, no Crashed).
    twice = once + states(("PENDING", 90), ("RUNNING", 95), ("SCHEDULED", 200))
    assert moves.preemptions(twice) == 2
    left = decide(twice, now=201.0)
    assert left.action == "leave" and left.why == "gpu-spot: preempted 2 times"
    # The last rung keeps it: the reschedule automation's own cap decides there.
    assert decide(twice, last=True, now=201.0).action == "wait"


def test_a_crash_is_given_the_automations_grace_then_leaves_or_fails():
    crashed = states(("SCHEDULED", 0), ("RUNNING", 2), ("CRASHED", 100))
    assert decide(crashed, now=150.0).action == "wait"
    rung = GpuPool(pool="gpu-spot", max_preemptions=5)
    assert decide(crashed, rung=rung, now=230.0).action == "leave"
    assert decide(crashed, rung=rung, now=230.0, last=True).action == "failed"


@pytest.mark.parametrize("final,action", [("COMPLETED", "done"), ("FAILED", "failed"), ("CANCELLED", "failed")])
def test_final_states(final, action):
    assert decide(states(("SCHEDULED", 0), ("RUNNING", 1), (final, 2))).action == action


def test_deployment_names_per_rung():
    assert rungs.deployment("train", "gpu") == "gpt2-train/train"
    assert rungs.deployment("evaluate", "gpu-spot") == "gpt2-eval/evaluate-gpu-spot"


def test_the_config_key_takes_a_list_or_the_shorthand_and_is_runtime():
    from gpt2.config.identity import train_fingerprint

    short = resolve_config("smoke", {"runtime.gpu_pools": "gpu-spot:1.1:300:2,gpu:3.9"})
    listed = resolve_config("smoke", {"runtime.gpu_pools": [
        {"pool": "gpu-spot", "price_per_hour": 1.1, "start_timeout_s": 300, "max_preemptions": 2},
        {"pool": "gpu", "price_per_hour": 3.9}]})
    assert short.runtime.gpu_pools == listed.runtime.gpu_pools
    assert train_fingerprint(short) == train_fingerprint(resolve_config("smoke", {}))
    assert rungs.price_for(short, "gpu-spot") == 1.1 and rungs.price_for(short, "elsewhere") is None


@pytest.mark.parametrize("value,named", [
    ("gpu-spot:-1,gpu", "runtime.gpu_pools[0].price_per_hour"),
    ("gpu,gpu-spot:1:0", "runtime.gpu_pools[1].start_timeout_s"),
    ("gpu:1:60:0", "runtime.gpu_pools[0].max_preemptions"),
    ("GPU Spot", "runtime.gpu_pools[0].pool"),
    ("gpu,gpu", "more than once"),
])
def test_bad_rungs_are_refused_by_name(value, named):
    with pytest.raises(ConfigError) as err:
        resolve_config("smoke", {"runtime.gpu_pools": value})
    assert named in str(err.value)


def _attempt(pool, price, hours, devices=1, trained=True):
    return {"pool": pool, "price_per_hour": price, "devices": devices, "started_at": 0.0,
            "ended_at": hours * 3600, "first_step_at": 1.0 if trained else None, "end": "preempted"}


def test_the_bill_prices_each_attempt_at_its_pools_price_and_sums_per_pool():
    records = [_attempt("gpu-spot", 1.0, 2.0), _attempt("gpu-spot", 1.0, 1.0, trained=False),
               _attempt("gpu", 4.0, 0.5, devices=2)]
    total = bill.training_bill(records, price_per_hour=9.0)  # recorded prices win over the run's
    assert total["cost"] == pytest.approx(2.0 + 1.0 + 4.0)
    assert total["pools"]["gpu-spot"] == {"attempts": 1, "device_hours": pytest.approx(3.0), "price_per_hour": 1.0,
                                          "cost": pytest.approx(3.0)}
    assert total["pools"]["gpu"]["device_hours"] == pytest.approx(1.0)
    logged = bill.metrics(total)
    assert logged["bill/pools/gpu-spot/cost"] == pytest.approx(3.0) and logged["bill/pools/gpu/attempts"] == 1
    # The pipeline adds evaluate on the pool it ran on, at that pool's price.
    pipeline = bill.pipeline_bill(total, 0.1, 0.25, 4.0, None, "gpu")
    assert pipeline["gpu_cost"] == pytest.approx(7.0 + 1.0) and pipeline["pools"]["gpu"]["cost"] == pytest.approx(5.0)


def test_an_attempt_without_a_price_leaves_the_cost_unknown():
    records = [_attempt("gpu-spot", None, 1.0), _attempt("gpu", 4.0, 1.0)]
    assert bill.training_bill(records, price_per_hour=None)["cost"] is None
    assert bill.training_bill(records, price_per_hour=2.0)["cost"] == pytest.approx(6.0)


def test_a_trainer_whose_rung_was_left_lets_the_lease_go_and_stops(tmp_path):
    from gpt2.checkpoint.lease import Lease
    from gpt2.root import layout, storage

    config = resolve_config("smoke", {"runtime.root": str(tmp_path / "root")})
    lease_dir = layout.lease_dir(layout.run_dir(config))
    lease = Lease(lease_dir, 60.0, "run-on-a-left-rung").acquire()
    rungs.stop_if_left(config, lease, "run-on-a-left-rung")  # not left: it goes on holding the lease
    assert Lease(lease_dir, 60.0).holder() is not None

    storage.write_bytes_atomic(layout.left_run_marker(layout.root(config), "run-on-a-left-rung"),
                               b"gpu-spot: not started within 600 s (Late)")
    with pytest.raises(rungs.LeftRung, match="gpu-spot: not started within 600 s"):
        rungs.stop_if_left(config, lease, "run-on-a-left-rung")
    assert Lease(lease_dir, 60.0).holder() is None  # released: the next rung's trainer takes it at once
