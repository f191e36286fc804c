"""The stack's rescheduler hands a run stranded in Pending back to its pool
(cli.stack.rescheduler), on a real Prefect server.

Found by the fault soak (bench/soak/run.py): the cpu worker was SIGTERMed while
it submitted a pipeline's data stage; the run sat Pending ("Submitting"),
which no worker takes again, and its pipeline waited for its whole start
timeout."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import ConcurrencyLimitStrategy, ConcurrencyOptions
from prefect.states import Pending

from cli.stack import rescheduler


@flow
def _stage() -> None:
    pass


@pytest.fixture
def pool_runs(prefect_server):
    """Runs of a deployment (one at a time, as a GPU stage's) on a pool of their own."""
    with get_client(sync_client=True) as client:
        pool = f"rescheduler-{uuid.uuid4().hex[:12]}"  # unique: two tests may start within one second
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        deployment = client.create_deployment(
            flow_id=client.create_flow(_stage), name=pool, work_pool_name=pool, concurrency_limit=1,
            concurrency_options=ConcurrencyOptions(collision_strategy=ConcurrencyLimitStrategy.ENQUEUE))
        yield client, pool, lambda: client.create_flow_run_from_deployment(deployment)


def test_a_run_pending_since_before_its_pools_worker_started_is_handed_back(pool_runs):
    client, pool, new_run = pool_runs
    run = new_run()
    client.set_flow_run_state(run.id, Pending())  # a worker took it, and died
    said = []
    alive_since_before = {pool: datetime.now(timezone.utc) - timedelta(minutes=5)}
    assert rescheduler.hand_back(client, alive_since_before, said.append) == []  # its worker lives: left alone
    assert client.read_flow_run(run.id).state.is_pending()

    restarted = {pool: datetime.now(timezone.utc) + timedelta(seconds=rescheduler.STRANDED_GRACE_S + 1)}
    assert rescheduler.hand_back(client, restarted, said.append) == [run.name]
    state = client.read_flow_run(run.id).state
    assert state.is_scheduled() and "worker that took it stopped" in state.message
    assert run.name in said[0]

    # Its slot went with it: another run of the deployment can start, and the handed-back one waits its turn.
    other = new_run()
    client.set_flow_run_state(other.id, Pending())
    assert client.read_flow_run(other.id).state.is_pending()
    client.set_flow_run_state(run.id, Pending())
    assert client.read_flow_run(run.id).state.name == "AwaitingConcurrencySlot"


def test_a_pool_without_a_worker_of_the_stack_is_left_alone(pool_runs):
    client, pool, new_run = pool_runs
    run = new_run()
    client.set_flow_run_state(run.id, Pending())
    later = datetime.now(timezone.utc) + timedelta(minutes=5)
    assert run.name not in rescheduler.hand_back(client, {"another-pool": later}, lambda _: None)
    assert client.read_flow_run(run.id).state.is_pending()


def test_a_worker_restarted_seconds_after_it_died_submitting_still_strands_its_run():
    """Found by the long soak: the gpu worker SIGTERMed while it submitted the
    training run, the platform brought it back 8 s later; the run sat Pending
    for good under a 30 s margin. A run that went Pending after the worker
    started is that worker's own, and is left."""
    from prefect.client.schemas.objects import FlowRun

    pool, restarted = "gpu", datetime.now(timezone.utc)

    def pending_at(seconds: float) -> FlowRun:
        run = FlowRun(flow_id=uuid.uuid4(), work_pool_name=pool, state=Pending())
        run.state.timestamp = restarted + timedelta(seconds=seconds)
        return run

    assert rescheduler.stranded(pending_at(-8), {pool: restarted})
    assert not rescheduler.stranded(pending_at(1), {pool: restarted})
    assert not rescheduler.stranded(pending_at(-8), {"cpu": restarted})  # another pool's worker says nothing
