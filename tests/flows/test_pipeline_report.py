"""The parent flow's last step: the runs report on the pipeline's parent MLflow
run, and a report that cannot be drawn costing a warning, never the pipeline."""

from __future__ import annotations

import logging

from mlflow import MlflowClient

from flows.pipeline import report_runs
from gpt2.tracking.store import default_tracking_uri
from gpt2.tracking.tracker import Tracker
from tests.gpt2.train.fixtures import tiny_config
from tests.tasks.tracked_runs import training_run

log = logging.getLogger(__name__)


def test_the_pipeline_logs_report_png_to_its_parent_run(tmp_path, caplog):
    this, older = tiny_config(tmp_path), tiny_config(tmp_path, **{"train.lr": 1e-3})
    older_id = training_run(older, {"val/loss": [(4, 9.0)]})
    this_id = training_run(this, {"val/loss": [(4, 9.5), (8, 8.5)], "hellaswag/acc_norm": [(8, 0.26)]})
    caplog.set_level(logging.INFO)
    with Tracker(this, "pipeline-smoke-local", tags={"stage": "pipeline"}) as parent:
        report_runs(parent, this, this_id, log)
    client = MlflowClient(default_tracking_uri(this))
    assert [a.path for a in client.list_artifacts(parent.run_id)] == ["report.png"]
    assert "runs report (2 run(s)) logged" in caplog.text
    # The older run has no HellaSwag: the flow's log says so.
    assert f"runs report skipped {client.get_run(older_id).info.run_name} ({older_id}) on hellaswag" in caplog.text


def test_a_report_that_cannot_be_drawn_is_a_warning_and_the_parent_run_goes_on(tmp_path, caplog):
    config = tiny_config(tmp_path)  # a store with no training run in it: nothing to draw
    with Tracker(config, "pipeline-smoke-local", tags={"stage": "pipeline"}) as parent:
        report_runs(parent, config, None, log)
        parent.log_metrics({"after": 1.0}, step=0)
    run = MlflowClient(default_tracking_uri(config)).get_run(parent.run_id)
    assert "runs report not drawn: UserError: no training runs in experiment 'gpt2'" in caplog.text
    assert run.info.status == "FINISHED" and run.data.metrics["after"] == 1.0
    assert MlflowClient(default_tracking_uri(config)).list_artifacts(parent.run_id) == []


def test_no_report_when_tracking_is_off(tmp_path, caplog):
    config = tiny_config(tmp_path, **{"tracking.enabled": False})
    with Tracker(config, "pipeline-smoke-local") as parent:
        report_runs(parent, config, None, log)
    assert "runs report" not in caplog.text and not (tmp_path / "mlflow.db").exists()
