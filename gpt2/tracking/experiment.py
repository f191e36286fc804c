"""The experiment the runs go into, made the way MLflow's UI makes one: an ML
(model training) experiment, not a GenAI one; and links into the MLflow UI (an
experiment's runs table, or one run) in the view a training run belongs in.
Works through any MLflow client it is given (gpt2.tracking.tracker's, `gpt2 stack`'s)."""

from __future__ import annotations

from typing import Any

from gpt2.secrets import redact

# The experiment's kind as MLflow's UI sets it when a user picks one: an ML, not a GenAI, experiment.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


def ensure_experiment(client: Any, name: str, artifact_location: str) -> str:
    """The id of experiment `name`, created if missing, tagged with its kind (EXPERIMENT_KIND)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in exp.tags:  # made by an earlier release, or by hand
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location,
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except Exception:  # noqa: BLE001 - another process created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


# MLflow 3.17's UI mode: the link's `workflowType`, else localStorage (GenAI until switched), never the tag.
UI_MODE_QUERY = "workflowType=machine_learning"


def ui_link(uri: str, experiment_id: str | None, run_id: str | None = None) -> str:
    """The experiment's runs table (or one run) in the MLflow UI, in "Model training" mode (UI_MODE_QUERY;
    GenAI mode lists a training run under "Evaluation runs"). `mlflow ui` serves SQLite at its default."""
    base = "http://127.0.0.1:5000" if uri.startswith("sqlite:") else redact(uri).rstrip("/")
    if not base.startswith(("http://", "https://")) or experiment_id is None:
        return base
    return f"{base}/#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "") + f"?{UI_MODE_QUERY}"


def children_link(uri: str, experiment_id: str | None, parent_run_id: str) -> str:
    """The runs table filtered to one run's children (a sweep's members), in the training view: the
    UI's own `searchFilter` parameter, as its "runs by user" links use it."""
    from urllib.parse import quote

    link = ui_link(uri, experiment_id)
    if "?" not in link:
        return link
    return link + "&searchFilter=" + quote(f"tags.`mlflow.parentRunId` = '{parent_run_id}'", safe="")
