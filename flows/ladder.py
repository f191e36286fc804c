"""A GPU stage down the ladder of GPU pools (runtime.gpu_pools), from the
parent flow's stage runner: no scheduler of our own, only Prefect's
deployments, states and the reschedule automation.

For each rung in turn the parent starts the stage's deployment on that rung's
pool (its own idempotency key per rung, so a restarted parent re-attaches) and
watches the run's state history (gpt2.ladder.moves.verdict decides). To leave a rung
it, in this order: marks the run as left in the root (a run that starts anyway
stops before it trains: flows.train, gpt2.train.run), records the rung left and
why (a restarted parent skips it), cancels the run and waits for the cancel
(bounded), and only then starts the next rung's run. So there are never two
trainers, and two GPU machines are billed at once for at most a cancellation.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Cancelling

from flows.run_events import RunWakeup
from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.ladder import moves, rungs
from gpt2.root import layout, storage

POLL_S = 5.0
CANCEL_WAIT_S = 60.0
"""How long the ladder waits for a left run's cancellation (a worker killing its
job) before it goes on anyway: the left-run marker still stops that run."""
SERVER_AWAY_S = 900.0
"""How long a parent watching a rung waits for a Prefect server that stopped answering."""


class LadderNotDeployed(UserError):
    """A rung of runtime.gpu_pools has no deployment of a GPU stage on its pool."""


class LadderExhausted(RuntimeError):
    """The stage failed on the last rung; the message names every rung tried."""


def check_deployed(config: Config) -> None:
    """Before any stage runs: every rung has the train and evaluate deployments,
    each on the rung's own pool (prefect.yaml names them; `prefect deploy`)."""
    problems = []
    with get_client(sync_client=True) as client:
        for rung in config.runtime.gpu_pools:
            for stage in rungs.FLOWS:
                name = rungs.deployment(stage, rung.pool)
                try:
                    found = client.read_deployment_by_name(name)
                except ObjectNotFound:
                    problems.append(f"{name} (rung {rung.pool}) is not deployed")
                    continue
                if found.work_pool_name != rung.pool:
                    problems.append(f"{name} runs on work pool {found.work_pool_name}, not on rung {rung.pool}")
    if problems:
        raise LadderNotDeployed(
            "runtime.gpu_pools names rungs without their deployments: " + "; ".join(problems)
            + ". Add `train-<pool>` and `evaluate-<pool>` to prefect.yaml (its ladder anchors) and "
            "`prefect deploy` them, or drop the rung")


def left_state(config: Config):
    """Where a GPU stage's flow run starts: None, or, when the ladder left this
    run's rung (it started anyway, late or in the race), the Cancelled state
    the flow returns at once, before any preflight, training or evaluation."""
    from prefect.runtime import flow_run

    marker = layout.left_run_marker(layout.root(config), str(flow_run.id)) if flow_run.id else None
    if marker is None or not storage.exists(marker):
        return None
    why = storage.read_bytes(marker).decode(errors="replace")
    get_run_logger().warning("this run's work pool was left by the ladder of GPU pools (%s): not running", why)
    return Cancelled(message=f"left by the ladder of GPU pools: {why}")


def _history(client, run_id) -> list[moves.State]:
    states = sorted(client.read_flow_run_states(run_id), key=lambda s: s.timestamp)
    return [moves.State(s.type.value, s.name or "", s.timestamp.timestamp(), s.message or "") for s in states]


def _cancel(client, run: FlowRun, why: str) -> None:
    """Cancelling where a worker holds the run (it kills the job), Cancelled
    where none does yet (Scheduled, Crashed)."""
    holding = run.state is not None and run.state.type in (StateType.PENDING, StateType.RUNNING, StateType.CANCELLING)
    state = Cancelling(message=why) if holding else Cancelled(message=why)
    client.set_flow_run_state(run.id, state, force=True)


def _leave(config: Config, record_url: str, left: list[dict], run: FlowRun, why: str) -> None:
    storage.write_bytes_atomic(layout.left_run_marker(layout.root(config), str(run.id)), why.encode())
    left.append({"pool": run.work_pool_name, "why": why, "flow_run_id": str(run.id), "flow_run": run.name})
    storage.write_record(record_url, {"left": left})
    with get_client(sync_client=True) as client:
        _cancel(client, client.read_flow_run(run.id), f"left by the ladder of GPU pools: {why}")
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not client.read_flow_run(run.id).state.is_final() and time.monotonic() < deadline:
            time.sleep(1)


def _sweep(client, left: list[dict]) -> None:
    """A left run the reschedule automation put back (it acted on a crash just
    before the cancel) is cancelled again: it must not hold a machine."""
    for entry in left:
        run = client.read_flow_run(entry["flow_run_id"])
        if run.state is not None and not run.state.is_final():
            get_run_logger().warning("flow run %s on left rung %s came back %s: cancelling it again",
                                     run.name, entry["pool"], run.state.name)
            _cancel(client, run, f"left by the ladder of GPU pools: {entry['why']}")


def _server_away(err: BaseException) -> bool:
    """The Prefect API did not answer (restarting, unreachable, overloaded): worth waiting for."""
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError

    if isinstance(err, PrefectHTTPStatusError):
        return err.response.status_code >= 500
    return isinstance(err, (httpx.TransportError, OSError))


def _watch(run_id, rung, last: bool, config: Config, grace_s: float, left: list[dict],
           tick: Callable[..., None] | None = None):
    """Poll the run until the ladder's verdict is not `wait`. A Prefect server
    that goes away (a restart, an upgrade) is waited for up to SERVER_AWAY_S:
    the verdict comes from the run's history on the server, so the ladder
    carries on where it was when the server is back."""
    with RunWakeup(run_id) as wake:  # the run's events wake the poll as its state changes (flows.run_events)
        return _poll_verdict(run_id, rung, last, config, grace_s, left, tick, wake)


def _poll_verdict(run_id, rung, last: bool, config: Config, grace_s: float, left: list[dict],
                  tick: Callable[..., None] | None, wake: RunWakeup):
    away_since = None
    while True:
        try:
            with get_client(sync_client=True) as client:
                run = client.read_flow_run(run_id)
                decided = moves.verdict(_history(client, run_id), rung, last, time.time(),
                                         config.runtime.stage_start_timeout_s, grace_s)
                _sweep(client, left)
            away_since = None
        except Exception as err:  # noqa: BLE001 - only a server that does not answer is waited for
            if not _server_away(err):
                raise
            away_since = away_since or time.monotonic()
            if time.monotonic() - away_since > SERVER_AWAY_S:
                raise
            get_run_logger().warning("the Prefect API does not answer (%s: %s); waiting for it", type(err).__name__,
                                     err)
            time.sleep(POLL_S)
            continue
        if decided.action != "wait":
            return decided, run
        if tick is not None:
            tick()
        wake.wait(POLL_S)


def _parameters(config: Config, parameters: dict[str, Any], after_a_left_rung: bool) -> dict[str, Any]:
    """After a rung was left, the trainer waits out a lease that the left run's
    trainer may still hold while its cancellation kills it, instead of refusing."""
    if not after_a_left_rung:
        return parameters
    wait = max(config.runtime.lease_wait_s, config.runtime.lease_ttl_s + CANCEL_WAIT_S)
    return {**parameters, "overrides": {**parameters["overrides"], "runtime.lease_wait_s": wait}}


def run_on_ladder(stage: str, config: Config, parameters: dict[str, Any], parent_key: str,
                  grace_s: float, tick: Callable[..., None] | None = None) -> tuple[FlowRun, list[dict]]:
    """The stage's completed run, on the first rung that ran it to the end, and
    the rungs left on the way ({pool, why, flow_run_id, flow_run}, in order);
    `tick` runs at every poll (flows.child_progress)."""
    logger = get_run_logger()
    record_url = layout.ladder_record(config, parent_key, stage)
    left: list[dict] = list((storage.read_record(record_url) or {}).get("left", []))
    ladder = config.runtime.gpu_pools
    for i, rung in enumerate(ladder):
        if any(entry["pool"] == rung.pool for entry in left):
            continue  # left before this parent's restart
        name = rungs.deployment(stage, rung.pool)
        child = run_deployment(name, parameters=_parameters(config, parameters, bool(left)), timeout=0,
                               idempotency_key=f"{parent_key}:{stage}:{rung.pool}", as_subflow=True)
        logger.info("stage %s: flow run %s on rung %d/%d, work pool %s (deployment %s)", stage, child.name,
                    i + 1, len(ladder), rung.pool, name)
        decided, run = _watch(child.id, rung, i == len(ladder) - 1, config, grace_s, left, tick)
        if decided.action == "done":
            return run, left
        if decided.action == "leave":
            logger.warning("stage %s moves down the ladder: %s", stage, decided.why)
            _leave(config, record_url, left, run, decided.why)
            continue
        tried = [entry["why"] for entry in left] + [decided.why if decided.why.startswith(rung.pool)
                                                     else f"{rung.pool}: {decided.why}"]
        raise LadderExhausted(f"stage {stage} (flow run {run.name}) did not complete on the ladder of GPU pools; "
                              f"rungs tried: {'; '.join(tried)}")
    raise LadderExhausted(f"stage {stage}: every rung of runtime.gpu_pools was left before this parent restarted: "
                          + "; ".join(entry["why"] for entry in left))
