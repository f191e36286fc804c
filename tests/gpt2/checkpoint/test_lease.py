"""One trainer per run: the lease, its fencing, and two real trainers at once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from mlflow import MlflowClient

from gpt2.checkpoint import store
from gpt2.checkpoint.lease import Lease, LeaseHeld, LeaseLost
from gpt2.root import layout, storage
from gpt2.tracking.store import default_tracking_uri
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.test_train_process import finish, launch, wait_for
from tests.tiers import scenario
from tests.warm_python import running_pid


@pytest.fixture(params=["file", "memory", "gcs"])
def lease_dir(request, tmp_path):
    if request.param == "file":
        yield storage.normalize_url(str(tmp_path / "run" / "lease"))
        return
    if request.param == "gcs":  # a real GCS JSON API (emulator): generation preconditions over HTTP
        yield f"{request.getfixturevalue('gcs_emulator')}/lease-{time.monotonic_ns()}/run/lease"
        return
    url = f"memory://lease-test-{time.monotonic_ns()}/run/lease"
    yield url
    storage.remove(url.rsplit("/run/", 1)[0], recursive=True)


def test_a_second_trainer_is_refused_naming_the_holder(lease_dir):
    first = Lease(lease_dir, ttl_s=60, flow_run_id="run-a").acquire()
    with pytest.raises(LeaseHeld) as err:
        Lease(lease_dir, ttl_s=60, flow_run_id="run-b").acquire()
    assert f"pid {os.getpid()}" in str(err.value) and "flow run run-a" in str(err.value)
    first.release()  # let go: the next trainer takes it at once, as the next generation
    second = Lease(lease_dir, ttl_s=60).acquire()
    assert (first.generation, second.generation) == (1, 2)
    with pytest.raises(LeaseLost):
        first.check()
    second.release()


def test_of_trainers_racing_for_a_free_run_exactly_one_wins(lease_dir):
    if lease_dir.startswith("gs://"):
        # gcsfs sends ifGenerationMatch=0 for mode="create"; the emulator ignores
        # preconditions (8 racing creates: 7 "won"), so only real GCS can show this.
        pytest.skip("the GCS emulator does not implement generation preconditions")
    results, start = [], threading.Barrier(8)

    def contender():
        lease = Lease(lease_dir, ttl_s=60)
        start.wait()
        results.append((lease.try_acquire() is None, lease))

    threads = [threading.Thread(target=contender) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [lease for won, lease in results if won]
    assert len(winners) == 1
    winners[0].check()  # the winner holds the newest generation


def test_a_stale_lease_is_taken_over_and_its_old_holder_is_fenced(lease_dir, caplog):
    old = Lease(lease_dir, ttl_s=0.4).acquire()
    old._stop.set()  # paused: it no longer renews
    time.sleep(0.5)
    new = Lease(lease_dir, ttl_s=0.4).acquire()
    assert "taking over the stale lease" in caplog.text
    assert new.generation == old.generation + 1
    with pytest.raises(LeaseLost, match="passed to a later trainer"):
        old.check()
    new.release()


def test_a_released_lease_is_taken_without_calling_it_stale(lease_dir, caplog):
    """A trainer that ended let go of the lease (renewed_at 0): the next one takes
    it quietly, not with a warning about a holder 'last renewed 56 years ago'."""
    Lease(lease_dir, ttl_s=60).acquire().release()
    second = Lease(lease_dir, ttl_s=60).acquire()
    assert second.generation == 2 and "stale" not in caplog.text
    second.release()


def test_waiting_for_a_holder_that_lets_go(lease_dir):
    first = Lease(lease_dir, ttl_s=60).acquire()
    threading.Timer(0.5, first.release).start()
    second = Lease(lease_dir, ttl_s=60).acquire(wait_s=30, poll_s=0.1)
    assert second.generation == 2
    second.release()


def _steps_logged(config) -> list[int]:
    client = MlflowClient(default_tracking_uri(config))
    run_id = storage.read_json(storage.join(store.latest_checkpoint(config), "state.json"))["mlflow_run_id"]
    return [m.step for m in client.get_metric_history(run_id, "train/loss")]


@scenario
def test_two_trainers_on_one_run_one_trains_the_other_refuses(tmp_path):
    config = tiny_config(tmp_path, **{"train.max_steps": 12, "train.checkpoint_every": 4})
    write_dataset(config)
    first, lines = launch(config, tmp_path), []
    wait_for(first, "step 2/12", lines)
    holder = running_pid(first)
    # Held still while the second one tries (its lease lives 120 s): it cannot
    # finish first, however slowly the second starts.
    os.kill(holder, signal.SIGSTOP)
    try:
        second, second_lines = launch(config, tmp_path), []
        assert finish(second, second_lines, timeout=120) == 1
    finally:
        os.kill(holder, signal.SIGCONT)
    assert any(f"pid {holder}" in line and "another trainer holds this run" in line for line in second_lines)
    assert finish(first, lines) == 0, "".join(lines[-20:])
    steps = _steps_logged(config)
    assert sorted(steps) == list(range(1, 13))  # every step once: nobody logged twice


@scenario
def test_a_paused_trainer_whose_run_was_taken_over_stops_by_itself(tmp_path):
    # 16 steps: the taker resumes from step 4 and must be seen training (step 10)
    # before the paused trainer comes back; more steps only lengthen the taker's run.
    config = tiny_config(tmp_path, **{"train.max_steps": 16, "train.checkpoint_every": 4, "runtime.lease_ttl_s": 1})
    write_dataset(config)
    paused, paused_lines = launch(config, tmp_path), []
    wait_for(paused, "step 5/16", paused_lines)
    trainer = running_pid(paused)  # the trainer itself, not a warm interpreter's proxy for it
    os.kill(trainer, signal.SIGSTOP)  # a VM that freezes
    time.sleep(1.5)  # ... past the lease's time
    taker, taker_lines = launch(config, tmp_path), []
    wait_for(taker, "step 10/16", taker_lines)  # it resumed the run and trains on
    os.kill(trainer, signal.SIGCONT)  # the VM comes back
    assert finish(paused, paused_lines, timeout=120) == 1
    assert any("passed to a later trainer" in line or "took over" in line for line in paused_lines)
    assert finish(taker, taker_lines) == 0, "".join(taker_lines[-20:])
    assert store.latest_checkpoint(config).endswith("step_000016")
    assert any("taking over the stale lease" in line for line in taker_lines)
    assert [g for g in storage.list_dir(layout.lease_dir(layout.run_dir(config)))] == ["000001.json", "000002.json"]


def test_a_holder_that_died_on_this_machine_is_not_waited_for(lease_dir, tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lease = Lease(lease_dir, ttl_s=3600)
    lease.generation = 1
    record = json.loads(lease._record(time.time()))
    record["holder"]["pid"] = int(dead.stdout)  # fresh, but its process is gone (SIGKILL, OOM kill)
    storage.create_exclusive(lease._url(1), json.dumps(record).encode())
    taker = Lease(lease_dir, ttl_s=3600).acquire()
    assert taker.generation == 2
    taker.release()


def test_the_same_flow_run_waits_for_its_own_earlier_attempt(lease_dir):
    earlier = Lease(lease_dir, ttl_s=0.6, flow_run_id="run-1").acquire()
    earlier._stop.set()  # its machine went away without notice: no more renewals
    t0 = time.monotonic()
    again = Lease(lease_dir, ttl_s=0.6, flow_run_id="run-1").acquire(poll_s=0.1)  # no wait_s given
    assert again.generation == 2 and time.monotonic() - t0 < 30
    with pytest.raises(LeaseHeld):  # another flow run is refused at once
        Lease(lease_dir, ttl_s=0.6, flow_run_id="run-2").acquire()
    again.release()


def test_a_lease_dated_in_the_future_is_live_and_the_skew_is_named(tmp_path, caplog):
    lease_dir = storage.normalize_url(str(tmp_path / "run" / "lease"))
    holder = Lease(lease_dir, ttl_s=60, flow_run_id="ahead")
    holder.generation = 1
    record = json.loads(holder._record(time.time() + 600))  # a holder whose clock runs 10 min ahead
    record["holder"]["host"] = "another-machine"
    storage.create_exclusive(storage.join(lease_dir, "000001.json"), json.dumps(record).encode())
    with pytest.raises(LeaseHeld, match="flow run ahead"):
        Lease(lease_dir, ttl_s=60).acquire()
    assert "in this machine's future" in caplog.text and "NTP" in caplog.text
