"""A GPU deployment's concurrency slot survives a restart of the stack's
Prefect server (cli.stack.lease_storage), on the server as `gpt2 stack up`
starts and restarts it, for real.

Found by the fault soak (bench/soak/run.py): the server restarted while a
training run was being started; the run was Cancelled ("Deployment
concurrency slot lost during provisioning") and the pipeline failed. With
Prefect's in-memory leases the same restart under a running training flow
fails its next lease renewal, and Prefect's engine cancels the run."""

from __future__ import annotations

import pytest
from prefect import flow
from prefect.client.schemas.objects import ConcurrencyLimitStrategy, ConcurrencyOptions
from prefect.states import Completed, Pending, Running

from cli.stack import prefect_setup, processes, services
from tests.cli.stack.fixtures import clean_env

pytestmark = pytest.mark.e2e


@flow
def _gpu_stage() -> None:
    pass


@pytest.fixture
def stack_server(tmp_path):
    """The stack's Prefect server alone, started (and restartable) as `gpt2 stack up` does."""
    state_dir = tmp_path / "state"
    services._private_dir(state_dir)
    auth = services._auth_string(state_dir)
    state = {"processes": []}
    services._start_server(state, state_dir, clean_env(tmp_path / "home"), auth)
    services._write_state(state_dir, state)
    try:
        processes.wait_http(state["processes"][0], f"{state['prefect_api_url']}/health", services.SERVER_START_S)
        yield state_dir, state["prefect_api_url"], auth
    finally:
        for rec in services.read_state(state_dir)["processes"]:
            processes.stop(rec)


def test_a_gpu_runs_concurrency_slot_survives_a_server_restart(stack_server):
    state_dir, api, auth = stack_server
    with prefect_setup.client(api, auth) as c:
        deployment = c.create_deployment(
            flow_id=c.create_flow(_gpu_stage), name="train", concurrency_limit=1,
            concurrency_options=ConcurrencyOptions(collision_strategy=ConcurrencyLimitStrategy.ENQUEUE))
        run = c.create_flow_run_from_deployment(deployment)
        c.set_flow_run_state(run.id, Pending())  # the worker takes it: the slot and its lease
        lease = c.read_flow_run(run.id).state.state_details.deployment_concurrency_lease_id
        assert lease is not None
        assert (state_dir / "concurrency-leases" / f"{lease}.json").exists()  # the stack's own, not ~/.prefect's

    services.restart(state_dir, "server")  # an upgrade, an OOM kill: back on the same port and database

    with prefect_setup.client(api, auth) as c:
        c.renew_concurrency_lease(lease, lease_duration=300)  # the running flow's renewal: raises if lost
        c.set_flow_run_state(run.id, Running())
        assert c.read_flow_run(run.id).state.is_running()  # not Cancelled for a lost slot

        # One slot still: a second run waits for it, and gets it once the first is done.
        second = c.create_flow_run_from_deployment(deployment)
        c.set_flow_run_state(second.id, Pending())
        assert c.read_flow_run(second.id).state.name == "AwaitingConcurrencySlot"
        c.set_flow_run_state(run.id, Completed())
        c.set_flow_run_state(second.id, Pending())
        assert c.read_flow_run(second.id).state.is_pending()
