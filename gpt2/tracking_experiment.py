"""The experiment the runs go into, made the way MLflow's UI makes one: an ML
(model training) experiment, not a GenAI one. Works through any MLflow client
it is given (gpt2.tracking's, `gpt2 stack`'s)."""

from __future__ import annotations

from typing import Any

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
