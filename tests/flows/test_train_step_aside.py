"""A training attempt that finds a later attempt of its own flow run started
(flows.train.step_aside_if_superseded) ends without reporting a state, so its
late failure cannot land on the newer attempt, which trains on; an attempt
that was not superseded fails as before. Real Prefect server, real flow-run
processes. Found by the fault soak: a training machine frozen past the zombie
window, its run rescheduled, the thawed trainer fenced by the new attempt's
lease; its Failed state failed the pipeline under the running new attempt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prefect.client.orchestration import get_client

REPO = Path(__file__).resolve().parents[2]

ATTEMPT = '''
import sys
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run
from prefect.states import Running, Scheduled
from flows.train import step_aside_if_superseded

@flow
def frozen_attempt(superseded: bool):
    print("FLOW_RUN", flow_run.id, flush=True)
    if superseded:  # the run was rescheduled and a newer attempt of it runs now
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Scheduled(name="AwaitingRetry"), force=True)
            client.set_flow_run_state(flow_run.id, Running(), force=True)
    try:
        raise RuntimeError("the trainer exited with code 1: another trainer took over")
    except BaseException:
        step_aside_if_superseded()
        raise

frozen_attempt(sys.argv[1] == "1")
'''


def _attempt(prefect_server: str, superseded: bool) -> tuple[int, str]:
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", ATTEMPT, "1" if superseded else "0"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    run_id = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("FLOW_RUN"))
    return done.returncode, run_id


def test_a_superseded_attempt_steps_aside_and_leaves_the_run_to_the_newer_one(prefect_server):
    code, run_id = _attempt(prefect_server, superseded=True)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    assert code == 0
    assert run.state.is_running() and run.run_count == 2  # the newer attempt's, untouched


def test_an_attempt_not_superseded_fails_as_before(prefect_server):
    code, run_id = _attempt(prefect_server, superseded=False)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    assert code != 0 and run.state.is_failed() and run.run_count == 1
