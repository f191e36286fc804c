"""A sweep started as a user starts one on the stack (`prefect deployment run gpt2/sweep` with a
grid), its own process SIGKILLed once its first member runs and rescheduled by the automation: the
data stage prepared once, no member started twice, each member a `gpt2/full-pipeline` run with every stage on
its pool, the GPU pool's one slot respected (no two members' training attempts overlap, from their
attempt records), the table published, a member bit for bit the run `gpt2 run` makes alone.
On the pytest worker's shared stack (tests/flows/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.background import started
from tests.cli.stack.fixtures import clean_env
from tests.flows.pipeline_stack import (
    PIPELINE_TIMEOUT_S,
    assert_completed,
    client,
    flow_run_process,
    overrides,
    wait_settled,
)
from tests.flows.test_sweep import _gpt2, _weights
from tests.tiers import STACK_B

# One pytest worker's stack for this module and the other modules of STACK_B (tests/tiers.py).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(STACK_B)]

REPO = Path(__file__).resolve().parents[2]
LRS = [2e-3, 4e-3]


def _sweep_run(stack, params: dict, grid: dict) -> str:
    args = ["deployment", "run", "gpt2/sweep", "--param", "preset=smoke", "--param", f"overrides={json.dumps(params)}",
            "--param", f"grid={json.dumps(grid)}"]
    done = subprocess.run([sys.executable, "-m", "prefect", *args], env=stack["env"], cwd=stack["base"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"UUID: ([0-9a-f-]{36})", done.stdout).group(1)


def _children(stack, deployment: str, key_prefix: str) -> list:
    with client(stack) as c:
        dep = c.read_deployment_by_name(deployment)
        return [r for r in c.read_flow_runs(limit=200) if r.deployment_id == dep.id
                and (r.idempotency_key or "").startswith(key_prefix)]


def test_a_sweep_deployment_killed_and_rescheduled_runs_each_member_once_one_gpu_slot_at_a_time(stack, tmp_path):
    from flows.stages import results_url
    from gpt2.config.overrides import resolve_config
    from gpt2.root import storage
    from gpt2.train.attempts import read_attempts

    params = overrides(stack, **{"train.max_steps": 4, "runtime.max_parallel_runs": 2})
    # Member 2 as `gpt2 run` makes it alone on another root: trained meanwhile.
    env = {**clean_env(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    alone = started(_gpt2, env, tmp_path, "run", "--preset", "smoke", "--set", "train.max_steps=4", "--set",
                    f"train.lr={LRS[1]}", "--root", str(tmp_path / "root"), "--set",
                    f"runtime.work_dir={tmp_path / 'w'}")
    sweep_id = _sweep_run(stack, params, {"train.lr": LRS})
    # The sweep's own process SIGKILLed once its first member runs: the reschedule automation starts
    # it again, and it re-attaches to what it had started (data stage, member) instead of starting twice.
    deadline = time.monotonic() + PIPELINE_TIMEOUT_S
    while not _children(stack, "gpt2/full-pipeline", sweep_id):
        assert time.monotonic() < deadline, "the sweep never started a member"
        time.sleep(1)
    os.kill(flow_run_process(stack, sweep_id, timeout=60).pid, signal.SIGKILL)
    sweep = wait_settled(stack, sweep_id)
    assert_completed(stack, sweep, "the sweep after its process was killed")
    assert sweep.run_count >= 2
    config = resolve_config("smoke", params)
    result = storage.read_json(results_url(config, sweep_id))
    rows = result["members"]
    assert [r["state"] for r in rows] == ["trained", "trained"] and result["failed"] == []

    # Each member a full-pipeline run of the sweep's, every stage on its pool.
    members = _children(stack, "gpt2/full-pipeline", sweep_id)
    assert len(members) == 2 and all(m.state.is_completed() for m in members)
    assert {m.work_pool_name for m in members} == {"cpu"}
    # The data stage prepared once: the sweep's own data run; the members' found it cached.
    data_runs = [r for m in [sweep, *members] for r in _children(stack, "gpt2-data/data", str(m.id))]
    assert len(data_runs) == 3
    assert sorted(storage.read_json(results_url(config, str(r.id)))["cached"] for r in data_runs) == [False, True, True]

    # The GPU pool's one slot (max_parallel_runs=2 asked for more): no two training attempts overlap.
    spans = sorted((a["started_at"], a["ended_at"]) for r in rows
                   for a in read_attempts(storage.normalize_url(str(Path(stack["root"]) / "runs" / r["run"]))))
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], spans

    # Member 2 bit for bit the run `gpt2 run` makes alone on another root.
    ours, theirs = _weights(rows[1]["checkpoint"]), _weights(alone.result()["checkpoint"])
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
