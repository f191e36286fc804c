"""Every stage run opened through tasks.tracking carries the same tags."""

from __future__ import annotations

from mlflow import MlflowClient
from prefect import flow

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.tracking import default_tracking_uri
from tasks.tracking import checkpoint_tags, stage_run
from tests.gpt2.train.fixtures import tiny_config

REF = CheckpointRef(url="file:///r/runs/x-1/checkpoints/step_000060", step=60, model_sha256="ab" * 32)


def _tags(config, run_id: str) -> dict:
    tags = MlflowClient(default_tracking_uri(config)).get_run(run_id).data.tags
    return {k: v for k, v in tags.items() if not k.startswith("mlflow.")}


def test_outside_a_flow_run_there_is_no_flow_run_tag(tmp_path):
    config = tiny_config(tmp_path)
    with stage_run(config, "eval-x", "evaluate", tags=checkpoint_tags(REF)) as tracker:
        pass
    assert _tags(config, tracker.run_id) == {"stage": "evaluate", "checkpoint": REF.url, "step": "60"}


def test_inside_a_flow_run_the_run_is_linked_to_it(tmp_path, prefect_server):
    config = tiny_config(tmp_path)

    @flow
    def stage_flow() -> tuple[str, str]:
        from prefect.runtime import flow_run

        with stage_run(config, "data-x", "data", tags={"cached": "false"}) as tracker:
            pass
        return tracker.run_id, str(flow_run.id)

    run_id, flow_run_id = stage_flow()
    assert _tags(config, run_id) == {"stage": "data", "cached": "false", "prefect.flow_run_id": flow_run_id}
