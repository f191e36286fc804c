"""MLflow tracking for every stage; the only module of `gpt2` that imports mlflow.

A `Tracker` owns one MLflow run. Calls only queue records (params, metrics,
tags, artifacts); a background thread sends them in batches and, while the
tracking server is unreachable, keeps them and retries with backoff, so an
outage costs a warning, never the training run. Reopening with `run_id`
resumes the same MLflow run, so a resumed training run's curves continue.

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
from collections import deque
from pathlib import Path
from typing import Any, Callable

from gpt2 import storage
from gpt2.config import Config

log = logging.getLogger(__name__)

Op = tuple[str, Callable[[Any, str], None]]
"""(description, fn(client, run_id)) of one queued non-metric record."""

MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_CHARS = 6000


def work_dir(config: Config) -> Path:
    return Path(config.runtime.work_dir or Path.home() / ".cache" / "gpt2-pipeline").expanduser()


def default_tracking_uri(config: Config) -> str:
    """`tracking.uri`, else a SQLite store beside a local root, else one in the work dir."""
    if config.tracking.uri:
        return config.tracking.uri
    local = storage.local_path(storage.normalize_url(config.runtime.root))
    base = local if local is not None else work_dir(config)
    return f"sqlite:///{base / 'mlflow.db'}"


def artifact_location(config: Config) -> str:
    """Experiment artifacts live under the artifact root (not ./mlruns in the
    cwd) when MLflow can write there; roots it has no store for use the work dir."""
    root = storage.normalize_url(config.runtime.root)
    if root.split("://", 1)[0] in ("file", "gs", "s3"):
        return storage.join(root, "mlflow-artifacts")
    return (work_dir(config) / "mlflow-artifacts").as_uri()


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


def _prepare_sqlite(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


class Tracker:
    """One MLflow run fed from a background sender; see the module docstring."""

    def __init__(self, config: Config, run_name: str, run_id: str | None = None,
                 parent_run_id: str | None = None, tags: dict[str, Any] | None = None,
                 enabled: bool = True, system_metrics: bool = False,
                 flush_interval_s: float = 5.0, connect_timeout_s: float = 10.0,
                 close_timeout_s: float = 30.0):
        self.enabled, self.run_id, self.run_name = enabled, run_id, run_name
        self.uri = default_tracking_uri(config)
        self._experiment, self._artifacts = config.tracking.experiment, artifact_location(config)
        self._tags = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            self._tags["mlflow.parentRunId"] = parent_run_id
        self._resumed, self._ready = run_id is not None, False
        self._system_metrics, self._monitor = system_metrics, None
        self._metrics: deque = deque()
        self._ops: deque[Op] = deque()
        self._lock, self._wake = threading.Lock(), threading.Event()
        self._tried, self._stopping = threading.Event(), False
        self._interval, self._close_timeout = flush_interval_s, close_timeout_s
        self._outage: str | None = None
        self._spool = Path(tempfile.mkdtemp(prefix="gpt2-tracking-")) if enabled else None
        self._thread = None
        if enabled:
            _prepare_sqlite(self.uri)
            self._thread = threading.Thread(target=self._run, name="mlflow-sender", daemon=True)
            self._thread.start()
            self._tried.wait(connect_timeout_s)  # so run_id is known up front when MLflow is up

    # ----- public API: every call only queues -----

    def log_params(self, params: dict[str, Any]) -> None:
        flat = flatten(params)
        self._queue(f"{len(flat)} params", lambda c, rid: self._send_params(c, rid, flat))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self._lock:
            self._metrics.extend(Metric(metric_name(k), float(v), now, step) for k, v in metrics.items())
        if len(self._metrics) >= MAX_METRICS_PER_BATCH:
            self._wake.set()

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        if not self.enabled:
            return
        # Copied now: the caller may delete or rewrite the file before it is sent.
        src = Path(local_path)
        dst = Path(tempfile.mkdtemp(dir=self._spool)) / src.name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
        send = "log_artifacts" if src.is_dir() else "log_artifact"
        self._queue(f"artifact {src.name}", lambda c, rid: getattr(c, send)(rid, str(dst), artifact_path))

    def log_dict(self, obj: Any, name: str) -> None:
        self._queue(f"artifact {name}", lambda c, rid: c.log_dict(rid, obj, name))

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(k, str(v)) for k, v in tags.items()]
        self._queue(f"{len(batch)} tags", lambda c, rid: c.log_batch(rid, tags=batch))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued is sent; False if still pending at `timeout`."""
        if not self.enabled:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wake.set()
        while self._pending():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self, status: str = "FINISHED") -> None:
        """End the run with `status` after a bounded final flush."""
        if not self.enabled or self._thread is None:
            return
        self._stop_monitor()
        self._queue(f"status {status}", lambda c, rid: c.set_terminated(rid, status=status))
        sent = self.flush(self._close_timeout)
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5)
        if not sent:
            log.warning("MLflow at %s still unreachable: %d metrics and %d records were not sent",
                        self.uri, len(self._metrics), len(self._ops))
        shutil.rmtree(self._spool, ignore_errors=True)
        self._thread = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close("FINISHED" if exc_type is None else "KILLED" if exc_type is KeyboardInterrupt else "FAILED")

    # ----- the sender thread -----

    def _queue(self, what: str, fn: Callable[[Any, str], None]) -> None:
        if self.enabled:
            with self._lock:
                self._ops.append((what, fn))
            self._wake.set()

    def _pending(self) -> bool:
        return bool(self._metrics or self._ops or not self._ready)

    def _run(self) -> None:
        from mlflow import MlflowClient

        client, backoff = MlflowClient(tracking_uri=self.uri), 0.0
        while not self._stopping:
            ok = self._drain(client)
            self._tried.set()
            backoff = 0.0 if ok else min(60.0, max(1.0, backoff * 2))
            self._wake.wait(backoff or self._interval)
            self._wake.clear()

    def _drain(self, client: Any) -> bool:
        try:
            self._ensure_run(client)
            while self._ops:
                self._ops[0][1](client, self.run_id)
                with self._lock:
                    self._ops.popleft()
            while self._metrics:
                with self._lock:
                    batch = [self._metrics[i] for i in range(min(MAX_METRICS_PER_BATCH, len(self._metrics)))]
                client.log_batch(self.run_id, metrics=batch)
                with self._lock:
                    for _ in batch:
                        self._metrics.popleft()
        except Exception as err:  # noqa: BLE001 - an outage must never reach the training loop
            if self._outage is None:
                log.warning("MLflow at %s unavailable (%s: %s); continuing, records are kept and retried",
                            self.uri, type(err).__name__, str(err).splitlines()[0][:300] if str(err) else "")
            self._outage = str(err)
            return False
        if self._outage is not None:
            log.warning("MLflow at %s reachable again; buffered records sent", self.uri)
            self._outage = None
        return True

    def _ensure_run(self, client: Any) -> None:
        if self._ready:
            return
        if self.run_id is not None and not self._reopen(client):
            self.run_id, self._resumed = None, False
        if self.run_id is None:
            run = client.create_run(self._experiment_id(client), run_name=self.run_name, tags=self._tags)
            self.run_id = run.info.run_id
        self._ready = True
        log.info("MLflow run %s (%s) at %s", self.run_id, "resumed" if self._resumed else "new", self.uri)
        self._start_monitor()

    def _reopen(self, client: Any) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            client.update_run(self.run_id, status="RUNNING")
        except MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            log.warning("MLflow run %s not found at %s; starting a new run", self.run_id, self.uri)
            return False
        if self._tags:
            from mlflow.entities import RunTag

            client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in self._tags.items()])
        return True

    def _experiment_id(self, client: Any) -> str:
        exp = client.get_experiment_by_name(self._experiment)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(self._experiment, artifact_location=self._artifacts)
        except Exception:  # noqa: BLE001 - another process created it first
            exp = client.get_experiment_by_name(self._experiment)
            if exp is None:
                raise
            return exp.experiment_id

    def _send_params(self, client: Any, run_id: str, flat: dict[str, str]) -> None:
        from mlflow.entities import Param

        # A resumed run already has its params; MLflow refuses to change them.
        existing = client.get_run(run_id).data.params if self._resumed else {}
        new = [Param(k, v) for k, v in flat.items() if k not in existing]
        for i in range(0, len(new), MAX_PARAMS_PER_BATCH):
            client.log_batch(run_id, params=new[i:i + MAX_PARAMS_PER_BATCH])

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
