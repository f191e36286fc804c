"""The one way a Prefect task or flow opens its stage's MLflow run.

Every stage run carries the same tags: the stage, the Prefect flow run that
produced it (so the MLflow UI links back to Prefect), and, for the stages
that read a checkpoint, which one. The training run is the exception that
proves the rule: it is opened inside the trainer (gpt2.train.loop), which
gets these tags through `flow_run_tags`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpt2.config import Config
from gpt2.tracking import Tracker

if TYPE_CHECKING:  # the checkpoint package loads torch: the parent flow, which opens runs, never needs it
    from gpt2.checkpoint.ref import CheckpointRef


def flow_run_tags() -> dict[str, str]:
    """{"prefect.flow_run_id": …} inside a flow run, {} outside one."""
    from prefect.runtime import flow_run

    return {"prefect.flow_run_id": str(flow_run.id)} if flow_run.id else {}


def checkpoint_tags(ref: CheckpointRef) -> dict[str, str]:
    return {"checkpoint": ref.url, "step": str(ref.step)}


def stage_run(config: Config, name: str, stage: str, parent_run_id: str | None = None,
              run_id: str | None = None, tags: dict[str, str] | None = None) -> Tracker:
    """A Tracker for one stage run (use it as a context manager)."""
    return Tracker(config, name, run_id=run_id, parent_run_id=parent_run_id,
                   tags={"stage": stage, **flow_run_tags(), **(tags or {})})
