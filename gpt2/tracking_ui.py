"""Links into the MLflow UI: an experiment's runs table, or one run, in the
view a training run belongs in."""

from __future__ import annotations

from gpt2.secrets import redact

# MLflow 3.17's UI mode: the link's `workflowType`, else localStorage (GenAI until switched), never the tag.
UI_MODE_QUERY = "workflowType=machine_learning"


def ui_link(uri: str, experiment_id: str | None, run_id: str | None = None) -> str:
    """The experiment's runs table (or one run) in the MLflow UI, in "Model training" mode (UI_MODE_QUERY;
    GenAI mode lists a training run under "Evaluation runs"). `mlflow ui` serves SQLite at its default."""
    base = "http://127.0.0.1:5000" if uri.startswith("sqlite:") else redact(uri).rstrip("/")
    if not base.startswith(("http://", "https://")) or experiment_id is None:
        return base
    return f"{base}/#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "") + f"?{UI_MODE_QUERY}"
