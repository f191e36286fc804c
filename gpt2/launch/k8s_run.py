"""Multi-node training from a pod of the Kubernetes GPU pool: create the
objects of deployments/multinode/training-job.yaml, wait for the Job, and
turn the nodes' records into the result (gpt2.launch.k8s_status).

The Job is named for the run and the flow run, so a rescheduled attempt of
the same flow run finds a Job it started and still running and waits for it
instead of starting a second one; a finished one is replaced. The objects
are owned by the flow's pod: when that pod goes (a cancellation, its machine
reclaimed), Kubernetes deletes them and every node gets SIGTERM, so they
checkpoint and stop; a flow process that is stopped deletes them itself too.
An attempt that re-attaches makes its own pod their owner, so the earlier
attempt's pod being deleted later does not take the running Job with it; a
Job that vanishes while it is watched (deleted by anyone) is a lost node.

The flow's pod needs RBAC to get pods and to create, get and delete Jobs,
Services and ConfigMaps in its namespace (docs/multi-node.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Callable

from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.launch import k8s_status, k8s_template
from gpt2.train.run import TrainResult

log = logging.getLogger(__name__)

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
POLL_S = 10.0


def in_cluster() -> bool:
    """Running in a Kubernetes pod with a service account (where the GPU pool's jobs run)."""
    return "KUBERNETES_SERVICE_HOST" in os.environ and NAMESPACE_FILE.exists()


async def _apis():
    from kubernetes_asyncio import client, config

    config.load_incluster_config()
    api = client.ApiClient()
    return api, client.BatchV1Api(api), client.CoreV1Api(api)


async def _own_pod(core, api, namespace: str) -> dict:
    pod = await core.read_namespaced_pod(os.environ["HOSTNAME"], namespace)
    return api.sanitize_for_serialization(pod)


async def _delete(batch, core, name: str, namespace: str) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    for call in (lambda: batch.delete_namespaced_job(name, namespace, propagation_policy="Background"),
                 lambda: core.delete_namespaced_service(name, namespace),
                 lambda: core.delete_namespaced_config_map(name, namespace)):
        try:
            await call()
        except ApiException as err:
            if err.status != 404:
                raise


async def _existing_job(batch, name: str, namespace: str):
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        return await batch.read_namespaced_job_status(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


async def _adopt(batch, core, name: str, namespace: str, pod: dict) -> None:
    """Make `pod` the only owner of the run's objects (a JSON patch replaces
    the list): Kubernetes deletes an object once its owners are gone, and the
    earlier attempt's pod may be deleted while this one waits on the Job."""
    owners = k8s_template.owned_by(pod)
    if owners is None:
        return
    patch = [{"op": "replace", "path": "/metadata/ownerReferences", "value": owners}]
    for call in (batch.patch_namespaced_job, core.patch_namespaced_service, core.patch_namespaced_config_map):
        await call(name, namespace, patch)


async def _gone(batch, name: str, namespace: str) -> None:
    while await _existing_job(batch, name, namespace) is not None:
        await asyncio.sleep(2)


async def _start(config: Config, batch, core, api, name: str, namespace: str, nproc: int,
                 parent_run_id: str | None, tags: dict | None, emit: Callable[[str], None]) -> None:
    """Attach to a running Job of this name, or (re)create the objects."""
    job = await _existing_job(batch, name, namespace)
    if job is not None and job.metadata.deletion_timestamp is not None:
        emit(f"training Job {name} of an earlier attempt is being deleted: waiting for it to go")
        await _gone(batch, name, namespace)
        job = None
    pod = await _own_pod(core, api, namespace)
    if job is not None and not k8s_status.job_state(job).final:
        emit(f"training Job {name} is already running: waiting for it (now owned by this attempt's pod)")
        await _adopt(batch, core, name, namespace, pod)
        return
    if job is not None:
        emit(f"replacing the finished training Job {name} ({k8s_status.job_state(job).reason})")
        await _delete(batch, core, name, namespace)
        await _gone(batch, name, namespace)
    k8s_status.clear_outcomes(config, name)
    limits = await _own_job_limits(batch, pod, namespace)
    objects = k8s_template.render(k8s_template.values(config, name, namespace, pod, nproc, parent_run_id, tags,
                                                      **limits))
    creators = {"ConfigMap": core.create_namespaced_config_map, "Service": core.create_namespaced_service,
                "Job": batch.create_namespaced_job}
    for obj in objects:
        await creators[obj["kind"]](namespace, obj)
    emit(f"started training Job {name}: {config.runtime.nnodes} pods x {nproc} GPU(s), rendezvous at "
         f"{k8s_template.rdzv_endpoint(name)}")


async def _own_job_limits(batch, pod: dict, namespace: str) -> dict:
    """The flow pod's own Job's activeDeadlineSeconds (the pool's maximum run
    time per attempt), for the nodes' Job: {} when the pod has no Job."""
    owner = next((o for o in pod.get("metadata", {}).get("ownerReferences") or [] if o.get("kind") == "Job"), None)
    if owner is None:
        return {}
    job = await _existing_job(batch, owner["name"], namespace)
    return {"active_deadline_seconds": job.spec.active_deadline_seconds} if job is not None else {}


async def _wait(batch, name: str, namespace: str, emit: Callable[[str], None], poll_s: float):
    said = None
    while True:
        job = await _existing_job(batch, name, namespace)
        if job is None:
            # Its pods went with it: the nodes that recorded nothing are lost (k8s_status.outcome).
            state = k8s_status.JobState(final=True, succeeded=False, reason="the Job was deleted while it ran")
            emit(f"training Job {name}: {state.reason}")
            return state
        state = k8s_status.job_state(job)
        if state.reason != said:
            emit(f"training Job {name}: {state.reason}")
            said = state.reason
        if state.final:
            return state
        await asyncio.sleep(poll_s)


async def _run(config: Config, nproc: int, parent_run_id: str | None, tags: dict | None,
               emit: Callable[[str], None], poll_s: float) -> TrainResult:
    namespace = NAMESPACE_FILE.read_text().strip()
    name = k8s_template.job_name(config, (tags or {}).get("prefect.flow_run_id"))
    api, batch, core = await _apis()
    async with api:
        await _start(config, batch, core, api, name, namespace, nproc, parent_run_id, tags, emit)
        try:
            state = await _wait(batch, name, namespace, emit, poll_s)
        except BaseException:
            # We are going away: stop the nodes (SIGTERM, a checkpoint) rather than leave them unowned.
            await asyncio.shield(_delete(batch, core, name, namespace))
            raise
        result = k8s_status.outcome(name, state, k8s_status.read_outcomes(config, name))
        await _delete(batch, core, name, namespace)
        return result


def check_node_gpus(config: Config, flow_pod_gpus: int) -> None:
    """A coordinating pod without GPUs cannot say how many the nodes get."""
    if config.runtime.nproc_per_node == "auto" and flow_pod_gpus == 0:
        raise UserError(
            f"runtime.nnodes={config.runtime.nnodes} from a pod without GPUs (gpu_count=0, only coordinating) "
            "needs runtime.nproc_per_node set to each training pod's GPUs (auto would count this pod's, none)")


def kubernetes_train(config: Config, nproc: int, log_line: Callable[[str], None] | None = None,
                     parent_run_id: str | None = None, tags: dict | None = None,
                     poll_s: float = POLL_S) -> TrainResult:
    """Train on `runtime.nnodes` pods of `nproc` GPUs each; the result or the
    exception one machine's launcher would give (k8s_status.outcome)."""
    return asyncio.run(_run(config, nproc, parent_run_id, tags, log_line or log.info, poll_s))
