"""MLflow tracking for every stage: the Tracker, and what MLflow accepts (metric
names, params as flat strings, how many of each one log_batch call may carry).

A `Tracker` owns one MLflow run. Calls only queue records (params, metrics, tags,
artifacts); a background thread sends them in batches and, while the tracking server
is unreachable, keeps them and retries with backoff, so an outage costs a warning,
never the training run. Reopening with `run_id` continues a resumed run's curves.

    with Tracker(config, "smoke-1a2b3c", tags={"stage": "train"}) as t:
        t.log_params(config.model_dump(mode="json"))
        t.log_metrics({"train/loss": 3.2}, step=10)
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from gpt2.config.tree import Config
from gpt2.secrets import redact
from gpt2.tracking.experiment import ensure_experiment
from gpt2.tracking.outbox import Outbox
from gpt2.tracking.store import artifact_location, default_tracking_uri, prepare_sqlite

log = logging.getLogger(__name__)


MAX_METRICS_PER_BATCH, MAX_PARAMS_PER_BATCH, MAX_PARAM_CHARS = 1000, 100, 6000  # MLflow's log_batch limits


def metric_name(key: str) -> str:
    """MLflow accepts letters, digits and `_-. :/` only (lm-eval emits `acc,none`)."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 6e-4}} -> {"train.lr": "0.0006"} for MLflow params."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:MAX_PARAM_CHARS]
    return out


def _last_steps(run: Any) -> dict[str, int]:
    """{metric: its highest step in the run}: MLflow keeps each metric's latest point with the run."""
    return {m.key: int(m.step) for m in getattr(run.data, "_metric_objs", [])}


class Tracker:
    """One MLflow run fed through a background Outbox; see the module docstring."""

    def __init__(self, config: Config, run_name: str, run_id: str | None = None,
                 parent_run_id: str | None = None, tags: dict[str, Any] | None = None,
                 enabled: bool = True, system_metrics: bool = False,
                 flush_interval_s: float = 5.0, connect_timeout_s: float = 10.0,
                 close_timeout_s: float = 30.0, fence: Callable[[], bool] | None = None,
                 on_new_run: Callable[[str], None] | None = None, reopen_match: str | None = None):
        """`fence`: asked before every send (a trainer's lease: Lease.still_held; gpt2.tracking.outbox.Outbox).
        `on_new_run`: told the id of a run this tracker creates (not of one it reopens), on
        the sender thread, as soon as MLflow has it; it must not raise (gpt2.train.mlflow_run).
        `reopen_match`: without `run_id`, an MLflow filter; the newest run of the experiment
        it matches is reopened instead of creating one (a rescheduled stage run's own)."""
        enabled = enabled and config.tracking.enabled
        self.enabled, self.run_id, self.run_name = enabled, run_id, run_name
        self.uri = default_tracking_uri(config)
        # For messages: $MLFLOW_TRACKING_URI is not validated like the config and may hold a password.
        self.safe_uri = redact(self.uri)
        self._experiment, self._artifacts = config.tracking.experiment, artifact_location(config)
        self._tags = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            self._tags["mlflow.parentRunId"] = parent_run_id
        self._resumed, self._ready, self._client, self._monitor = run_id is not None, False, None, None
        self._logged_through: dict[str, int] = {}  # a resumed run: per metric, the last step it holds
        self.experiment_id: str | None = None
        """Known once MLflow was reached (for links: gpt2.tracking.experiment.ui_link)."""
        self._system_metrics, self._close_timeout = system_metrics, close_timeout_s
        self._on_new_run, self._reopen_match = on_new_run, reopen_match
        self._outbox: Outbox | None = None
        self._spool: Path | None = None
        if enabled:
            self._outbox = Outbox(f"MLflow at {self.safe_uri}", self._connect, self._send_metrics,
                                  batch_size=MAX_METRICS_PER_BATCH, interval_s=flush_interval_s, fence=fence)
            self._outbox.wait_first_attempt(connect_timeout_s)  # so run_id is known up front when MLflow is up

    # ----- public API: every call only queues -----

    def log_params(self, params: dict[str, Any]) -> None:
        flat = flatten(params)
        self._queue(f"{len(flat)} params", lambda c: self._send_params(c, flat))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._outbox is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._outbox.put_points([Metric(metric_name(k), float(v), now, step) for k, v in metrics.items()])

    def unsent_points(self) -> list[list]:
        """The metric points not sent yet, as [key, value, timestamp ms, step]:
        a checkpoint keeps them (gpt2.train.checkpoint_state), so a trainer
        killed before MLflow had them sends them when it resumes (requeue)."""
        if self._outbox is None:
            return []
        return [[m.key, m.value, m.timestamp, m.step] for m in self._outbox.unsent_points()]

    def requeue(self, points: list[list]) -> None:
        """Send points an earlier attempt left unsent (unsent_points); those the
        run already holds are skipped like every redone step (_send_metrics)."""
        if self._outbox is None or not points:
            return
        from mlflow.entities import Metric

        self._outbox.put_points([Metric(k, float(v), int(t), int(s)) for k, v, t, s in points])

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        if self._outbox is None:
            return
        # Copied now: the caller may delete or rewrite the file before it is sent.
        src = Path(local_path)
        # Made at the first artifact, not with the tracker: a trainer killed before
        # it logs one (most of them) leaves no empty folder behind in the temp dir.
        self._spool = self._spool or Path(tempfile.mkdtemp(prefix="gpt2-tracking-"))
        dst = Path(tempfile.mkdtemp(dir=self._spool)) / src.name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
        send = "log_artifacts" if src.is_dir() else "log_artifact"
        self._queue(f"artifact {src.name}", lambda c: getattr(c, send)(self.run_id, str(dst), artifact_path))

    def log_dict(self, obj: Any, name: str) -> None:
        self._queue(f"artifact {name}", lambda c: c.log_dict(self.run_id, obj, name))

    def set_tags(self, tags: dict[str, Any]) -> None:
        pairs = {k: str(v) for k, v in tags.items()}
        self._queue(f"{len(pairs)} tags", lambda c: self._send_tags(c, pairs))

    def adopt(self, run_id: str | None) -> None:
        """Nest the run `run_id` under this one where it has no parent yet. A stage
        started before this run existed in MLflow (MLflow slow to answer or away
        when the pipeline began) opened its own run without a parent; queued here,
        this is sent once this run exists. A run already nested stays where it is."""
        if run_id:
            self._queue(f"child run {run_id}", lambda c: self._send_adopt(c, run_id))

    def flush(self, timeout: float | None = None, give_up_on_outage: bool = False) -> bool:
        """Wait until everything queued is sent; False if still pending at
        `timeout` (or, with give_up_on_outage, once a fresh attempt failed)."""
        return self._outbox is None or self._outbox.flush(timeout, give_up_on_outage)

    def close(self, status: str | None = "FINISHED") -> None:
        """End the run with `status` after a bounded final flush (one more
        attempt when MLflow is down, at most close_timeout_s when it is slow).
        status None: another trainer took the run over; send nothing more (it
        redoes these steps: a late batch would land twice) and leave it its run."""
        if self._outbox is None:
            return
        self._stop_monitor()
        if status is None:
            log.info("dropped %d unsent MLflow record(s): the run's new trainer logs them", self._outbox.discard())
        else:
            self._queue(f"status {status}", lambda c: c.set_terminated(self.run_id, status=status))
        sent = status is None or self._outbox.flush(self._close_timeout, give_up_on_outage=True)
        self._outbox.stop()
        if not sent:
            points, records = self._outbox.pending()
            log.warning("MLflow at %s still unreachable: %d metrics and %d records were not sent",
                        self.safe_uri, points, records)
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
        self._outbox = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close("FINISHED" if exc_type is None else "KILLED" if exc_type is KeyboardInterrupt else "FAILED")

    # ----- on the sender thread -----

    def _queue(self, what: str, send: Callable[[Any], None]) -> None:
        if self._outbox is not None:
            self._outbox.put(what, send)

    def _connect(self) -> Any:
        # Created in the retry loop: the client opens its store eagerly.
        if self._client is None:
            from mlflow import MlflowClient

            prepare_sqlite(self.uri)
            self._client = MlflowClient(tracking_uri=self.uri)
        self._ensure_run(self._client)
        return self._client

    def _ensure_run(self, client: Any) -> None:
        if self._ready:
            return
        if self.run_id is None and self._reopen_match:  # asked here: an outage delays it like create_run
            found = client.search_runs([self._experiment_id(client)], self._reopen_match, max_results=1,
                                       order_by=["attributes.start_time DESC"])
            self.run_id, self._resumed = (found[0].info.run_id, True) if found else (None, False)
        if self.run_id is not None and not self._reopen(client):
            self.run_id, self._resumed = None, False
        if self.run_id is None:
            run = client.create_run(self._experiment_id(client), run_name=self.run_name, tags=self._tags)
            self.run_id = run.info.run_id
            if self._on_new_run is not None:
                self._on_new_run(self.run_id)
        else:
            run = client.get_run(self.run_id)
            self._logged_through = _last_steps(run)
        self.experiment_id = run.info.experiment_id
        self._ready = True
        log.info("MLflow run %s (%s) at %s", self.run_id, "resumed" if self._resumed else "new", self.safe_uri)
        self._start_monitor()

    def _reopen(self, client: Any) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            client.update_run(self.run_id, status="RUNNING")
        except MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            log.warning("MLflow run %s not found at %s; starting a new run", self.run_id, self.safe_uri)
            return False
        if self._tags:
            self._send_tags(client, self._tags)
        return True

    def _experiment_id(self, client: Any) -> str:
        return ensure_experiment(client, self._experiment, self._artifacts)

    def _send_metrics(self, client: Any, batch: list) -> None:
        # A resumed run redoes the steps after its checkpoint: the run already
        # holds what the killed attempt sent of them (the same values: the
        # resume is exact), so each step of a metric is sent once.
        fresh = [m for m in batch if m.step > self._logged_through.get(m.key, -1)]
        if fresh:
            client.log_batch(self.run_id, metrics=fresh)

    def _send_adopt(self, client: Any, run_id: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            tags = client.get_run(run_id).data.tags
        except MlflowException as err:  # deleted meanwhile: nothing to nest, and no outage to wait out
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            log.warning("MLflow run %s not found at %s; not nested under %s", run_id, self.safe_uri, self.run_id)
            return
        if "mlflow.parentRunId" not in tags:
            client.set_tag(run_id, "mlflow.parentRunId", self.run_id)

    def _send_tags(self, client: Any, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def _send_params(self, client: Any, flat: dict[str, str]) -> None:
        from mlflow.entities import Param

        # A resumed run already has its params; MLflow refuses to change them.
        existing = client.get_run(self.run_id).data.params if self._resumed else {}
        new = [Param(k, v) for k, v in flat.items() if k not in existing]
        for i in range(0, len(new), MAX_PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=new[i:i + MAX_PARAMS_PER_BATCH])

    def _start_monitor(self) -> None:
        if not self._system_metrics:
            return
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(self.run_id, tracking_uri=self.uri, resume_logging=self._resumed)
            self._monitor.start()
        except Exception as err:  # noqa: BLE001 - optional extra
            log.warning("system metrics unavailable: %s", err)

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            # finish() joins without a timeout; never let it hold up the caller.
            stopper = threading.Thread(target=self._monitor.finish, daemon=True)
            stopper.start()
            stopper.join(timeout=5)
            self._monitor = None
