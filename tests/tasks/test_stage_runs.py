"""Every stage run opened through tasks.tracking carries the same tags."""

from __future__ import annotations

from mlflow import MlflowClient
from prefect import flow

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.tracking.store import default_tracking_uri
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


def test_a_stage_run_started_again_by_its_flow_run_reopens_its_mlflow_run(tmp_path, prefect_server):
    """A stage rescheduled after its machine died runs again as the same flow
    run: it continues the MLflow run its crashed attempt opened (one run per
    stage, as the fault soak's checker asks), while another flow run, another
    checkpoint and the per-attempt preflight each get a run of their own."""
    config = tiny_config(tmp_path)

    def attempt(name: str, stage: str = "evaluate", status: str = "FINISHED", **kw) -> str:
        tracker = stage_run(config, name, stage, tags=checkpoint_tags(REF), **kw)
        tracker.log_metrics({"hellaswag/acc": 0.25}, step=60)
        tracker.close(status)
        return tracker.run_id

    @flow
    def stage_flow() -> dict[str, str]:
        return {"crashed": attempt("eval-x-step_000060", status="FAILED"),  # its process got a SIGTERM
                "again": attempt("eval-x-step_000060"),
                "other checkpoint": attempt("eval-x-step_000070"),
                "preflight 1": attempt("preflight-x", "preflight", per_attempt=True),
                "preflight 2": attempt("preflight-x", "preflight", per_attempt=True)}

    first, second = stage_flow(), stage_flow()
    assert first["again"] == first["crashed"]
    client = MlflowClient(default_tracking_uri(config))
    run = client.get_run(first["again"])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "hellaswag/acc")] == [60]  # once
    assert len({first["again"], first["other checkpoint"], first["preflight 1"], first["preflight 2"]}) == 4
    assert second["crashed"] not in set(first.values())  # another flow run: a run of its own
