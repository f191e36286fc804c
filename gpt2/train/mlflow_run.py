"""Which MLflow run a trainer logs to: one run per training run, whatever
happened to its attempts.

A checkpoint's state.json names the run (a resumed trainer reopens it). An
attempt that dies before its first checkpoint (a full disk, a kill, a
preemption in the first minutes) leaves no checkpoint to name it, so the run's
id is also recorded beside its checkpoints (`runs/<run>/mlflow-run.json`) as
soon as MLflow created it; the next trainer, starting at step 0, reopens that
run, and the tracker skips the steps it already holds (the redone steps have
the same values: training is exact). `--fresh` removes the record with the
checkpoints (gpt2.train.session), and the next trainer opens a new run.
"""

from __future__ import annotations

import logging
from typing import Callable

from gpt2.root import layout, storage
from gpt2.secrets import redact

log = logging.getLogger(__name__)


def run_to_reopen(run_dir: str, state: dict) -> str | None:
    """The MLflow run this trainer continues: its checkpoint's, else the one an
    earlier attempt opened and recorded (before its first checkpoint, or while
    MLflow was away at its checkpoints); None: a new run."""
    if state.get("mlflow_run_id"):
        return state["mlflow_run_id"]
    recorded = (storage.read_record(layout.tracking_record(run_dir)) or {}).get("mlflow_run_id")
    if recorded:
        log.info("continuing MLflow run %s, which an earlier attempt opened (no checkpoint of it names it)",
                 recorded)
    return recorded


def recorder(run_dir: str, still_held: Callable[[], bool] | None) -> Callable[[str], None]:
    """Tracker's `on_new_run`: records the new run's id under the run, only while
    this trainer holds the run's lease (a trainer that lost it never writes there)."""
    def record(run_id: str) -> None:
        try:
            if still_held is None or still_held():
                storage.write_record(layout.tracking_record(run_dir), {"mlflow_run_id": run_id})
        except Exception as err:  # noqa: BLE001 - a record beside the run, never a reason to lose its metrics
            log.warning("could not record MLflow run %s under %s: %s", run_id, run_dir, redact(str(err)))
    return record
