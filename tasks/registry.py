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
from gpt2.tracking import Tracker, default_tracking_uri

log = logging.getLogger(__name__)

# Listing them skips MLflow's slow requirement inference.
PIP_REQUIREMENTS = ["transformers", "torch", "safetensors", "tokenizers"]


def register_hf_model(tracker: Tracker, hf_dir: str | Path, name: str, alias: str | None = None) -> int:
    """Log `hf_dir` to the tracker's run, register it as `name`, point `alias`
    at the new version; returns the version."""
    import mlflow
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not tracker.flush(timeout=60) or tracker.run_id is None:
        raise RuntimeError(f"MLflow at {tracker.uri} is unreachable; cannot register model {name!r}")
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    # mlflow's fluent API (all log_model offers) needs a global tracking URI,
    # and set_tracking_uri also exports it as $MLFLOW_TRACKING_URI, which the
    # rest of the pipeline reads: put the environment back exactly as it was.
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracker.uri)
    try:
        with mlflow.start_run(run_id=tracker.run_id):
            info = mlflow.transformers.log_model(
                {"model": model, "tokenizer": tokenizer}, name="hf", task="text-generation",
                registered_model_name=name, pip_requirements=PIP_REQUIREMENTS,
            )
        version = int(info.registered_model_version)
        if alias:
            mlflow.MlflowClient(tracking_uri=tracker.uri).set_registered_model_alias(name, alias, version)
    finally:
        mlflow.set_tracking_uri(None)  # clears the global and the variable
        if previous_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env
    return version


def model_version_exists(config: Config, name: str, version: int) -> bool:
    """Whether this config's tracking store still has `name` version `version`."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        MlflowClient(tracking_uri=default_tracking_uri(config)).get_model_version(name, str(version))
        return True
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            log.warning("could not look up %s version %s (%s); registering again", name, version, err)
        return False
