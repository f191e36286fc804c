"""The one way a Prefect task or flow opens its stage's MLflow run.

Every stage run carries the same tags: the stage, the Prefect flow run that
produced it (so the MLflow UI links back to Prefect), and, for the stages
that read a checkpoint, which one. The training run is the exception that
proves the rule: it is opened inside the trainer (gpt2.train.loop), which
gets these tags through `flow_run_tags`.
"""

from __future__ import annotations

import functools
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlsplit

from gpt2.config.tree import Config
from gpt2.secrets import redact
from gpt2.tracking.store import default_tracking_uri
from gpt2.tracking.tracker import Tracker

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the checkpoint package loads torch: the parent flow, which opens runs, never needs it
    from gpt2.checkpoint.ref import CheckpointRef


def flow_run_tags() -> dict[str, str]:
    """{"prefect.flow_run_id": …, "prefect.work_pool": …} inside a flow run (the
    pool only for a deployment's run: the ladder of GPU pools prices each
    training attempt by it), {} outside one."""
    from prefect.runtime import flow_run

    if not flow_run.id:
        return {}
    pool = _work_pool(str(flow_run.id))
    return {"prefect.flow_run_id": str(flow_run.id), **({"prefect.work_pool": pool} if pool else {})}


@functools.lru_cache(maxsize=8)
def _work_pool(flow_run_id: str) -> str | None:
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            return client.read_flow_run(flow_run_id).work_pool_name
    except Exception as err:  # noqa: BLE001 - a tag, never a reason for a stage to fail
        log.warning("could not read the work pool of flow run %s: %s", flow_run_id, redact(str(err)))
        return None


def checkpoint_tags(ref: CheckpointRef) -> dict[str, str]:
    return {"checkpoint": ref.url, "step": str(ref.step)}


def stage_run(config: Config, name: str, stage: str, parent_run_id: str | None = None,
              run_id: str | None = None, tags: dict[str, str] | None = None,
              per_attempt: bool = False) -> Tracker:
    """A Tracker for one stage run (use it as a context manager). Inside a flow
    run, the MLflow run of this stage and name that the same flow run opened
    before is reopened: a stage rescheduled after its machine died (or a task
    retried) keeps one MLflow run, as training does. `per_attempt`: a new run
    for each attempt (the preflight: each attempt checks another machine)."""
    own = flow_run_tags()
    match = None
    if run_id is None and not per_attempt and "prefect.flow_run_id" in own:
        match = _runs_of(name, stage, f"tags.`prefect.flow_run_id` = '{own['prefect.flow_run_id']}'")
    return Tracker(config, name, run_id=run_id, parent_run_id=parent_run_id,
                   tags={"stage": stage, **own, **(tags or {})}, reopen_match=match)


def run_under(parent: Tracker, start: Callable[[str | None], dict]) -> dict:
    """`start(parent_run_id)`: a stage (or a sweep's member) opened under `parent`'s MLflow
    run, nested afterwards where that run had no id yet when it started (nest_late)."""
    under = parent.run_id
    result = start(under)
    nest_late(parent, under, result)
    return result


def nest_late(parent: Tracker, started_under: str | None, result: dict) -> None:
    """A stage (or a sweep's member) started before `parent`'s MLflow run existed
    (`started_under` None: MLflow slow or away at the start) opened its run without a
    parent: nest it now (sent once the parent's run exists). A cached stage answers
    with an earlier pipeline's run, which stays under that pipeline."""
    if started_under is None and not result.get("cached"):
        parent.adopt(result.get("mlflow_run_id"))


def _runs_of(name: str, stage: str, more: str) -> str | None:
    """An MLflow filter for the runs of `stage` named `name` that also match
    `more`; None for a name a filter cannot quote (then nothing is looked up)."""
    return None if "'" in name else f"attributes.run_name = '{name}' and tags.stage = '{stage}' and {more}"


def finished_stage_run(config: Config, name: str, stage: str) -> str | None:
    """The newest FINISHED run of `stage` named `name` in this config's
    experiment: a cached stage answers with it instead of opening another
    run of the same result. None when tracking is off, when there is none,
    or when the store cannot be asked at once (the stage then opens its run
    through the outbox, which waits out an outage, as before)."""
    uri, finished = default_tracking_uri(config), _runs_of(name, stage, "attributes.status = 'FINISHED'")
    if not config.tracking.enabled or finished is None or not _answers_at_once(uri):
        return None
    from mlflow import MlflowClient

    try:
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(config.tracking.experiment)
        runs = [] if experiment is None else client.search_runs(
            [experiment.experiment_id], max_results=1, order_by=["attributes.start_time DESC"],
            filter_string=finished)
    except Exception as err:  # noqa: BLE001 - a lookup only: the stage opens a run of its own instead
        log.info("could not look up an earlier %s run in MLflow (%s); opening a new one", stage, redact(str(err)))
        return None
    return runs[0].info.run_id if runs else None


def _answers_at_once(uri: str) -> bool:
    """A store that holds no runs yet, or a server that refuses the connection,
    is not worth a query (MLflow's client retries a refused one for minutes)."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):]).exists()
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        try:
            with socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
                                          timeout=2):
                return True
        except OSError:
            return False
    return True
