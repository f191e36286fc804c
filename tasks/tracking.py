"""MLflow tags every stage run carries: the stage, the checkpoint it read and
the Prefect flow run that produced it."""

from __future__ import annotations

from gpt2.checkpoint.ref import CheckpointRef


def stage_tags(stage: str, ref: CheckpointRef) -> dict[str, str]:
    from prefect.runtime import flow_run

    tags = {"stage": stage, "checkpoint": ref.url, "step": str(ref.step)}
    if flow_run.id:
        tags["prefect.flow_run_id"] = str(flow_run.id)
    return tags
