"""Every stage run opened through tasks.tracking carries the same tags."""

from __future__ import annotations

from mlflow import MlflowClient
from prefect import flow

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.tracking.store import default_tracking_uri
from gpt2.tracking.tracker import Tracker
from tasks.tracking import checkpoint_tags, nest_late, stage_run
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


def test_a_stage_started_before_its_pipelines_run_existed_is_nested_once_it_does(tmp_path):
    # MLflow slow or away when the pipeline began: the parent's run has no id yet
    # when its first stage starts, so the stage opens its run without a parent
    # (seen in the fault soak: "0 data runs under the pipeline run"). The store's
    # directory is blocked by a plain file, exactly as when a volume is missing.
    blocked = tmp_path / "tracking"
    blocked.write_text("not a directory")
    config = tiny_config(tmp_path, **{"tracking.uri": f"sqlite:///{blocked}/mlflow.db"})
    parent = Tracker(config, "pipeline-x", tags={"stage": "pipeline"}, flush_interval_s=0.2, connect_timeout_s=1)
    under = parent.run_id
    assert under is None
    blocked.unlink()
    blocked.mkdir()
    with stage_run(config, "data-x", "data", parent_run_id=under) as data:
        pass
    with stage_run(config, "train-old", "train") as orphan:  # an earlier pipeline's, answered from cache
        pass
    with stage_run(config, "pipeline-other", "pipeline") as other, \
            stage_run(config, "eval-other", "evaluate", parent_run_id=other.run_id) as nested:
        pass
    nest_late(parent, under, {"mlflow_run_id": data.run_id})
    nest_late(parent, under, {"mlflow_run_id": orphan.run_id, "cached": True})
    nest_late(parent, under, {"mlflow_run_id": nested.run_id})  # already nested elsewhere: stays
    nest_late(parent, "some-run", {"mlflow_run_id": orphan.run_id})  # started under a parent: nothing to do
    nest_late(parent, under, {"mlflow_run_id": "0" * 32})  # deleted meanwhile: skipped, never blocks the rest
    nest_late(parent, under, {"mlflow_run_id": None})  # a stage that never reached MLflow
    parent.log_metrics({"stage_seconds/data": 1.0}, step=0)
    parent.close()

    client = MlflowClient(default_tracking_uri(config))
    parent_of = {run: client.get_run(run).data.tags.get("mlflow.parentRunId")
                 for run in (data.run_id, orphan.run_id, nested.run_id)}
    assert parent_of == {data.run_id: parent.run_id, orphan.run_id: None, nested.run_id: other.run_id}
    assert client.get_run(parent.run_id).data.metrics == {"stage_seconds/data": 1.0}
    assert client.get_run(parent.run_id).info.status == "FINISHED"
