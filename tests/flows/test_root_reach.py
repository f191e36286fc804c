"""A local artifact root is refused before any stage runs when a stage
deployment's pool runs its jobs in containers elsewhere (checked against a
real Prefect server's deployments and pools)."""

from __future__ import annotations

import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate

from flows import deployment_file
from flows.stages import DEPLOYMENTS, RootNotShared, check_root_reachable


@pytest.fixture
def stage_deployments(prefect_server):
    """Every stage deployment, on a process pool; yields a function that moves
    one stage's deployment onto a Kubernetes pool."""
    suffix = uuid.uuid4().hex[:6]
    process, kubernetes = f"cpu-{suffix}", f"gpu-{suffix}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=process, type="process"))
        client.create_work_pool(WorkPoolCreate(name=kubernetes, type="kubernetes",
                                               base_job_template=deployment_file.pool_template("kubernetes-gpu")))
        ids = {}
        for stage, full in DEPLOYMENTS.items():
            flow_name, name = full.split("/")
            ids[stage] = client.create_deployment(client.create_flow_from_name(flow_name), name,
                                                  work_pool_name=process)

        def move(stage: str) -> None:
            flow_name, name = DEPLOYMENTS[stage].split("/")
            client.create_deployment(client.create_flow_from_name(flow_name), name, work_pool_name=kubernetes)

        try:
            yield move
        finally:
            for deployment_id in ids.values():
                client.delete_deployment(deployment_id)
            client.delete_work_pool(kubernetes)
            client.delete_work_pool(process)


def test_a_local_root_is_refused_when_a_stage_runs_in_a_container(stage_deployments, smoke_config):
    local = smoke_config()
    check_root_reachable(local)  # every stage on a process pool: the root may be theirs
    stage_deployments("train")
    with pytest.raises(RootNotShared, match=r"train \(work pool gpu-\w+, type kubernetes\).*runtime.root=gs://"):
        check_root_reachable(local)
    bucket = local.model_copy(update={"runtime": local.runtime.model_copy(update={"root": "memory://bucket/gpt2"})})
    check_root_reachable(bucket)  # a bucket every pool reaches: nothing to refuse
