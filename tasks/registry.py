"""The MLflow model registry for the export stage: log a Hugging Face
directory as an MLflow `transformers` model, register it, move the alias.

Synchronous on purpose (the stage reports the version number), so it talks to
MLflow directly rather than through the queued `gpt2.tracking.Tracker`; it
logs into the tracker's run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpt2.config import Config
from gpt2.secrets import redact
from gpt2.tracking import Tracker, default_tracking_uri

log = logging.getLogger(__name__)

# Listing them skips MLflow's slow requirement inference.
PIP_REQUIREMENTS = ["transformers", "torch", "safetensors", "tokenizers"]
EXPORT_TAG = "export_fingerprint"
"""Model version tag: the fingerprint of the exported files it was logged from."""


def register_hf_model(tracker: Tracker, hf_dir: str | Path, name: str, alias: str | None = None, *,
                      export_id: str) -> int:
    """Log `hf_dir` to the tracker's run, register it as `name`, point `alias`
    at the new version; returns the version. `export_id` names the exported
    files: a version of `name` already tagged with it (left by an attempt that
    died before its result was recorded) is reused, not registered again."""
    import mlflow

    if not tracker.flush(timeout=60) or tracker.run_id is None:
        raise RuntimeError(f"MLflow at {tracker.safe_uri} is unreachable; cannot register model {name!r}")
    client = mlflow.MlflowClient(tracking_uri=tracker.uri)
    version = registered_version(client, name, export_id)
    if version is None:
        version = _log_and_register(tracker, hf_dir, name, {EXPORT_TAG: export_id})
    else:
        log.info("%s version %s already holds export %s; reusing it", name, version, export_id)
    if alias:
        client.set_registered_model_alias(name, alias, version)
    return version


def registered_version(client, name: str, export_id: str) -> int | None:
    """The newest version of `name` tagged with `export_id`, if any. Out of
    scope: two attempts registering at the same moment both find none and make
    two versions (MLflow has no unique constraint to stop the second)."""
    # The filter is on the tag alone (hex, safe to quote), the name is
    # compared here: a model name may hold quotes.
    found = client.search_model_versions(f"tags.{EXPORT_TAG} = '{export_id}'")
    versions = [int(v.version) for v in found if v.name == name and v.tags.get(EXPORT_TAG) == export_id]
    return max(versions, default=None)


def _log_and_register(tracker: Tracker, hf_dir: str | Path, name: str, tags: dict[str, str]) -> int:
    import mlflow
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    # mlflow's fluent API (all log_model offers) needs a global tracking URI,
    # and set_tracking_uri also exports it as $MLFLOW_TRACKING_URI, which the
    # rest of the pipeline reads: put the environment back exactly as it was.
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracker.uri)
    try:
        with mlflow.start_run(run_id=tracker.run_id):
            # `tags` go on the model version in the call that creates it, so
            # no crash can leave a version without its export id.
            info = mlflow.transformers.log_model(
                {"model": model, "tokenizer": tokenizer}, name="hf", task="text-generation",
                registered_model_name=name, pip_requirements=PIP_REQUIREMENTS, tags=tags, model_card=_model_card(name),
            )
    finally:
        mlflow.set_tracking_uri(None)  # clears the global and the variable
        if previous_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env
    return int(info.registered_model_version)


def _model_card(name: str):
    """The model card MLflow stores beside the model: ours. Without one MLflow
    asks the Hugging Face hub for the card of the model's name, here a local
    directory the hub never has, and warns on every export."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(library_name="transformers", pipeline_tag="text-generation", tags=["gpt2", "gpt2-pipeline"])
    return ModelCard(f"---\n{data.to_yaml()}\n---\n# {name}\n\nGPT-2 trained from scratch by gpt2-pipeline. "
                     "The MLflow run that registered this version holds its checkpoint, configuration and "
                     "export manifest.\n")


def model_version_exists(config: Config, name: str, version: int) -> bool:
    """Whether this config's tracking store still has `name` version `version`."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        MlflowClient(tracking_uri=default_tracking_uri(config)).get_model_version(name, str(version))
        return True
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            log.warning("could not look up %s version %s (%s); registering again", name, version, redact(str(err)))
        return False
