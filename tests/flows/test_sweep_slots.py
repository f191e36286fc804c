"""The sweep's members within its slots, inside a real flow run on a real Prefect server: at most
`parallel` at once, each in this flow run's context (its logger works in the worker threads), one
member's failure its own row while the others run, and members whose data stage failed never started."""

from __future__ import annotations

import threading
import time

from prefect import flow

from flows.sweep import run_members
from gpt2.sweep.members import resolve_members


def test_members_run_within_the_slots_and_fail_alone(prefect_server, tmp_path):
    members = resolve_members("smoke", {}, [{"train.lr": lr} for lr in (1e-3, 2e-3, 3e-3, 4e-3, 5e-3)],
                              root=str(tmp_path))
    lock, running, seen, started = threading.Lock(), [0], [], []

    def run_one(member):
        with lock:
            running[0] += 1
            seen.append(running[0])
            started.append(member.index)
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        if member.index == 2:
            raise RuntimeError("loss spike past train.max_rollbacks\nstack trace follows")
        return {"final_val_loss": 3.0 + member.index}

    @flow
    def sweep_like() -> list:
        return run_members(members, {5: "data stage: ShardError: bad shard"}, 2, run_one)

    outcomes = sweep_like()
    assert max(seen) == 2  # two at once, never three
    assert sorted(started) == [1, 2, 3, 4]  # member 5's data stage failed: never started
    assert outcomes[0] == ({"final_val_loss": 4.0}, None) and outcomes[3] == ({"final_val_loss": 7.0}, None)
    assert outcomes[1] == (None, "RuntimeError: loss spike past train.max_rollbacks")  # one line
    assert outcomes[4] == (None, "data stage: ShardError: bad shard")
