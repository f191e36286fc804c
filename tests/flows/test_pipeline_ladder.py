"""The ladder of GPU pools on the local stack, started as a user starts it
(`gpt2 stack up --gpu-pools gpu-spot,gpu-sky,gpu --no-worker gpu-spot`, then
`prefect deployment run gpt2/full-pipeline`), in one pipeline:

three rungs: `gpu-spot` has no worker (no capacity), `gpu-sky`'s worker
cannot start the job (its pool's command fails), `gpu` is healthy; the Prefect
server is restarted while the run waits on the first rung. The ladder carries
on from that rung's wait and the pipeline completes on `gpu`, the first two
runs end Cancelled having trained nothing, the summary says why each rung was
left; a run of a left rung that is started anyway afterwards (the race) stops
without training. (Until #59 the restart had a pipeline of its own, on two
rungs: the same path twice, ~110 s of the tier.)

Preemption on a rung is in test_pipeline_ladder_preemption.py. On the pytest worker's shared stack (tests/flows/conftest.py), shaped for the ladder.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

from tests.flows.ladder_runs import STEPS, attempts, first_rung_run, lease_holders, stage_runs, summary_text
from tests.flows.pipeline_stack import (
    PIPELINE_TIMEOUT_S,
    assert_completed,
    client,
    deployment_run,
    overrides,
    wait_final,
)
from tests.tiers import STACK_A

# One pytest worker's stack for this module and the other modules of STACK_A (tests/tiers.py).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(STACK_A)]

# Long enough that the server's restart (15 s away, then its start) falls inside the first rung's wait.
SPOT_WAIT_S = 60
SERVER_AWAY_S = 15


@contextlib.contextmanager
def job_command_fails(stack, pool: str):
    """The pool's worker starts every job with a command that exits 1 at once:
    a job that cannot start (an unschedulable pod, a refused Vertex job)."""
    from prefect.client.schemas.actions import WorkPoolUpdate

    with client(stack) as c:
        template = c.read_work_pool(pool).base_job_template
    broken = json.loads(json.dumps(template))
    broken["variables"]["properties"]["command"]["default"] = "false"
    with client(stack) as c:
        c.update_work_pool(pool, WorkPoolUpdate(base_job_template=broken))
    try:
        yield
    finally:
        with client(stack) as c:
            c.update_work_pool(pool, WorkPoolUpdate(base_job_template=template))


def test_three_rungs_and_a_server_restart_the_run_moves_down_to_the_one_with_capacity(stack):
    from gpt2.config.overrides import resolve_config
    from gpt2.root import layout, storage

    ladder = f"gpu-spot:1.0:{SPOT_WAIT_S},gpu-sky:2.0:300,gpu:4.0"
    params = overrides(stack, **{"train.lr": 3e-3, **STEPS, "runtime.gpu_pools": ladder})
    config = resolve_config("smoke", params)
    with job_command_fails(stack, "gpu-sky"):
        parent_id = deployment_run(stack, params)
        first_rung_run(stack, parent_id, "gpu-spot")
        # The server goes away while the run waits on the first rung, and comes back on the same port.
        restart = (f"from pathlib import Path; from cli.stack.services import restart_server; "
                   f"restart_server(Path({stack['state_dir']!r}), away_s={SERVER_AWAY_S})")
        subprocess.run([sys.executable, "-c", restart], env=stack["env"], cwd=stack["base"], check=True,
                       timeout=300)
        with client(stack) as c:  # back before the rung's wait was over: the restart fell inside it
            assert not c.read_flow_run(stage_runs(stack, parent_id)["gpu-spot"].id).state.is_final()
        parent = wait_final(stack, parent_id)
    assert_completed(stack, parent, "the pipeline down the ladder, across a server restart")

    runs = stage_runs(stack, parent_id)
    assert set(runs) == {"gpu-spot", "gpu-sky", "gpu"}, runs
    spot, sky, gpu = runs["gpu-spot"], runs["gpu-sky"], runs["gpu"]
    assert spot.state.is_cancelled() and sky.state.is_cancelled() and gpu.state.is_completed()
    assert spot.run_count == 0 and sky.run_count == 0  # neither flow ran: nothing trained there
    # The waits as configured, measured on the server's own history across its restart: the spot
    # rung its full wait (the parent carried on from it, not from zero), the broken one no longer
    # than it took to crash.
    assert (sky.created - spot.created).total_seconds() >= SPOT_WAIT_S
    print(f"time lost on the left rungs: {(gpu.created - spot.created).total_seconds():.0f} s "
          f"(configured waits {SPOT_WAIT_S} s)")

    records = attempts(config)
    assert records and {r["pool"] for r in records} == {"gpu"} and {r["price_per_hour"] for r in records} == {4.0}
    holders = lease_holders(config)
    assert holders and set(holders) == {str(gpu.id)}  # one lease chain, one trainer

    text = summary_text(stack, parent_id)
    assert f"left gpu-spot: not started within {SPOT_WAIT_S} s" in text, text
    assert "left gpu-sky: its job crashed before the flow ran" in text and "ran on gpu" in text, text
    assert "by pool: gpu 1 attempt(s)" in text, text
    record = storage.read_record(layout.ladder_record(config, parent_id, "train"))
    assert [entry["pool"] for entry in record["left"]] == ["gpu-spot", "gpu-sky"]

    # The race: the left spot run is started anyway (a worker took it as the ladder moved
    # on; here by hand, as its pod would). It stops before training: no attempt, no lease.
    _start_left_run_by_hand(stack, spot)
    assert len(attempts(config)) == len(records)
    assert lease_holders(config) == holders


def _start_left_run_by_hand(stack, run) -> None:
    from prefect.states import Scheduled

    from flows import deployment_file

    with client(stack) as c:
        c.set_flow_run_state(run.id, Scheduled(), force=True)
    env = {**stack["env"], deployment_file.PROJECT_DIR_ENV: str(deployment_file.PROJECT_DIR)}
    done = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "execute", str(run.id)], env=env,
                          cwd=stack["base"], capture_output=True, text=True, timeout=PIPELINE_TIMEOUT_S)
    with client(stack) as c:
        final = c.read_flow_run(run.id)
    assert final.state.is_cancelled(), f"{final.state.name}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert "left by the ladder of GPU pools" in (final.state.message or ""), final.state.message
