"""Running a stage from the parent flow: in-process, or as its own deployment
on the work pool that fits its hardware.

A stage deployment's run is started with an idempotency key derived from the
parent flow run, so a retried or rescheduled parent re-attaches to the child
it already started instead of renting a second GPU. `run_deployment` returns
as soon as the child is Crashed, even when the reschedule-after-preemption
automation is about to put it back to Scheduled: we keep re-reading the child
through that window and only give up once it stays Crashed.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment

from flows import child_progress, reschedule
from flows.run_events import RunWakeup
from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.ladder import rungs
from gpt2.root import layout, storage
from gpt2.secrets import redact, url_has_credentials
from gpt2.tracking.store import default_tracking_uri

# Stage name -> deployment (prefect.yaml is the single source of these).
DEPLOYMENTS = {
    "data": "gpt2-data/data",
    "train": "gpt2-train/train",
    "evaluate": "gpt2-eval/evaluate",
    "export": "gpt2-export/export",
}
RESCHEDULE_GRACE_S = reschedule.GRACE_S
"""How long a Crashed child may take to be rescheduled by the automation."""


class TrackingNotShared(UserError):
    """Stages on other machines would each log to a store of their own."""


def stage_overrides(config: Config, overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides a stage deployment gets: the parent's, with the artifact
    root and the MLflow store pinned as the parent resolved them. A job pod
    sees none of the environment the parent's worker had ($GPT2_ROOT,
    $MLFLOW_TRACKING_URI), so nothing may be left to it."""
    pinned = {**overrides, "runtime.root": layout.root(config)}
    if config.tracking.enabled:
        pinned["tracking.uri"] = default_tracking_uri(config)
        if url_has_credentials(pinned["tracking.uri"]):
            # Pinned URIs travel as Prefect parameters, shown in the UI and logs.
            raise TrackingNotShared(
                f"$MLFLOW_TRACKING_URI ({redact(pinned['tracking.uri'])}) carries credentials, which the pipeline "
                "would copy into every stage's Prefect parameters: set it without them and give each worker "
                "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead")
        if layout.local_root(config) is None and pinned["tracking.uri"].startswith("sqlite:"):
            raise TrackingNotShared(
                f"the artifact root {layout.root(config)} is remote, so the stages run on other machines, but "
                f"MLflow would log to {pinned['tracking.uri']} on each of them (lost with the machine): set "
                "tracking.uri (or $MLFLOW_TRACKING_URI where the pipeline starts) to an MLflow server, "
                "or tracking.enabled=false")
    return pinned


class RootNotShared(UserError):
    """A local artifact root with stages on pools whose machines cannot see it."""


def check_root_reachable(config: Config) -> None:
    """Before any stage runs: a local root (`file://`) is refused when a stage
    deployment sits on a work pool that is not a process pool (Kubernetes,
    Vertex AI, …): its job runs in a container on another machine, and would
    only fail at the first stage that reads what an earlier one wrote there."""
    if layout.local_root(config) is None:
        return
    elsewhere = []
    on_rungs = [(stage, rungs.deployment(stage, rung.pool)) for rung in config.runtime.gpu_pools for stage in rungs.FLOWS]
    with get_client(sync_client=True) as client:
        for stage, name in [*DEPLOYMENTS.items(), *on_rungs]:
            pool = client.read_work_pool(client.read_deployment_by_name(name).work_pool_name)
            if pool.type != "process":
                elsewhere.append(f"{stage} (work pool {pool.name}, type {pool.type})")
    if elsewhere:
        raise RootNotShared(
            f"the artifact root {layout.root(config)} is a local path, but {', '.join(elsewhere)} run(s) in "
            "containers on other machines that cannot read or write it: give the pipeline a root every pool "
            "reaches (runtime.root=gs://BUCKET/gpt2 or s3://…, or $GPT2_ROOT where it starts)")


class StageFailed(RuntimeError):
    """A stage's flow run ended Failed, Cancelled or Crashed for good."""


def results_url(config: Config, flow_run_id: str) -> str:
    """Where a stage flow run publishes its small JSON result for the parent:
    under the artifact root, readable from any machine (a GPU worker's local
    Prefect result storage is not)."""
    return layout.stage_result(config, flow_run_id)


def publish_result(config: Config, result: dict[str, Any]) -> None:
    """Called at the end of each stage flow; a no-op outside a flow run."""
    from prefect.runtime import flow_run

    if flow_run.id:
        storage.write_record(results_url(config, str(flow_run.id)), result)


def _read(run_id) -> FlowRun:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


WAITING_STATES = (StateType.SCHEDULED, StateType.PENDING)
POLL_S = 5.0
"""The longest the parent waits between two reads of a stage run (its events wake it sooner: flows.run_events)."""


def _wait_final(run_id, start_timeout_s: float, poll_s: float = POLL_S, tick: Callable[..., None] | None = None) -> FlowRun:
    """The run once it is final. A run that waits to start (Scheduled, Pending;
    a rescheduled one too) longer than `start_timeout_s` raises StageFailed
    saying what is missing, instead of keeping the parent waiting forever."""
    # prefect.flow_runs.wait_for_flow_run is async-only; this flow is sync. The run's events wake
    # the poll as its state changes (flows.run_events), so a stage that ended is noticed at once.
    with RunWakeup(run_id) as wake:
        return _poll_final(run_id, start_timeout_s, poll_s, tick, wake)


def _poll_final(run_id, start_timeout_s: float, poll_s: float, tick: Callable[..., None] | None,
                wake: RunWakeup) -> FlowRun:
    waiting_since = None
    while True:
        run = _read(run_id)
        if run.state is not None and run.state.is_final():
            return run
        if run.state is not None and run.state.type in WAITING_STATES:
            waiting_since = waiting_since or time.monotonic()
            if time.monotonic() - waiting_since > start_timeout_s:
                raise StageFailed(
                    f"flow run {run.name} has waited {start_timeout_s:.0f} s in {run.state.name} without starting: "
                    f"is a worker polling work pool {run.work_pool_name or '(none)'}, and can it get a machine "
                    "(GPU quota, spot capacity)? Start one (`prefect worker start --pool "
                    f"{run.work_pool_name or 'POOL'}`) or allow longer with runtime.stage_start_timeout_s")
        else:
            waiting_since = None
        if tick is not None:
            tick()
        wake.wait(poll_s)


def _settled(run_id, grace_s: float, start_timeout_s: float = float("inf"),
             tick: Callable[..., None] | None = None) -> FlowRun:
    """Wait for a final state that no automation is about to change; `tick`
    runs at every poll (the training child's progress line: flows.child_progress)."""
    with RunWakeup(run_id) as wake:  # one subscription for the whole wait, a put-back's included
        while True:
            run = _poll_final(run_id, start_timeout_s, POLL_S, tick, wake)
            if run.state.type != StateType.CRASHED:
                return run
            deadline = time.monotonic() + reschedule.grace_for(run, grace_s)
            while time.monotonic() < deadline:
                wake.wait(3)  # the automation's put-back noticed as it happens
                run = _read(run_id)
                if run.state.type != StateType.CRASHED:
                    break
            else:
                if not reschedule_in_its_place(run, grace_s):
                    return run
                continue
            get_run_logger().warning("stage run %s was rescheduled after a crash (%s); waiting for it",
                                     run.name, run.state.name)


def reschedule_in_its_place(run: FlowRun, grace_s: float) -> bool:
    """Put a stage run still Crashed `grace_s` after its crash back to
    Scheduled (AwaitingRetry), exactly as the reschedule automation would have,
    and only where it would have (flows.reschedule says why the automation can
    miss a crash); or one that crashed before it ever ran, within the same
    budget (flows.reschedule.unstarted_crashes). Returns whether it rescheduled the run."""
    with get_client(sync_client=True) as client:
        why = reschedule.why_put_back(client, run, reschedule.automation_run_counts(client), grace_s)
        if why is None:
            return False
        done, refused = reschedule.put_back(client, run, "the pipeline", why)
    if not done:
        get_run_logger().warning("stage run %s could not be rescheduled: %s", run.name, refused)
        return False
    get_run_logger().warning("stage run %s crashed (%s); rescheduled it: %s", run.name, run.state.message, why)
    return True


def run_stage_deployment(stage: str, config: Config, parameters: dict[str, Any], parent_key: str,
                         grace_s: float = RESCHEDULE_GRACE_S) -> dict[str, Any]:
    """Start (or re-attach to) a stage's deployment run and return its result;
    a GPU stage goes down the ladder of GPU pools when one is given
    (flows.ladder), with the rungs it tried in the result's `rungs`."""
    check_root_reachable(config)
    tick = child_progress.reporter(stage, config, get_run_logger().info)
    if config.runtime.gpu_pools and stage in rungs.FLOWS:
        from flows.ladder import run_on_ladder

        run, left = run_on_ladder(stage, config, parameters, parent_key, grace_s, tick)
        if tick is not None:
            tick(final=True)
        tried = [{"pool": e["pool"], "left": e["why"], "flow_run": e["flow_run"]} for e in left]
        return {**_result(stage, config, run), "rungs": tried + [{"pool": run.work_pool_name, "left": None,
                                                                   "flow_run": run.name}]}
    child = run_deployment(DEPLOYMENTS[stage], parameters=parameters, timeout=0,
                           idempotency_key=f"{parent_key}:{stage}", as_subflow=True)
    get_run_logger().info("stage %s: flow run %s on deployment %s", stage, child.name, DEPLOYMENTS[stage])
    return completed_result(stage, config, child, f"stage {stage} (flow run {child.name})", grace_s, tick)


def completed_result(stage: str, config: Config, child: FlowRun, what: str, grace_s: float = RESCHEDULE_GRACE_S,
                     tick: Callable[..., None] | None = None) -> dict[str, Any]:
    """The published result of a started child run once it has settled Completed; StageFailed
    saying how it ended otherwise (`what` names the run in that message)."""
    run = _settled(child.id, grace_s, config.runtime.stage_start_timeout_s, tick)
    if tick is not None:
        tick(final=True)  # where training got to, said once it ended (a short run ends between two lines)
    if run.state is None or run.state.type != StateType.COMPLETED:
        state = run.state.name if run.state else "unknown"
        message = run.state.message if run.state else ""
        raise StageFailed(f"{what} ended {state}: {message}")
    return _result(stage, config, run)


def _result(stage: str, config: Config, run: FlowRun) -> dict[str, Any]:
    """A completed stage run's published result (publish_result)."""
    url = results_url(config, str(run.id))
    result = storage.read_record(url)
    if result is None:
        raise StageFailed(f"stage {stage} (flow run {run.name}) completed but published no readable result at {url}")
    return result
