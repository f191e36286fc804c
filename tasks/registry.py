"""The MLflow model registry for the export stage: log a Hugging Face
directory as an MLflow `transformers` model, register it, move the alias.

The logged model answers as users call it: `mlflow.pyfunc.load_model(
"models:/NAME@ALIAS").predict(["prompt"], params={...})` and `mlflow models
serve`. Its signature declares the generation params (MLflow ignores any it
does not declare), its inference config gives a default length and keeps the
prompt and the answer within the model's positions, and the model card is the
version's description.

Synchronous on purpose (the stage reports the version number), so it talks to
MLflow directly rather than through the queued `gpt2.tracking.tracker.Tracker`; it
logs into the tracker's run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpt2.config.tree import Config
from gpt2.secrets import redact
from gpt2.tracking.store import default_tracking_uri
from gpt2.tracking.tracker import Tracker

log = logging.getLogger(__name__)

# Listing them skips MLflow's slow requirement inference.
PIP_REQUIREMENTS = ["transformers", "torch", "safetensors", "tokenizers"]
EXPORT_TAG = "export_fingerprint"
"""Model version tag: the fingerprint of the exported files it was logged from."""
EXAMPLE_PROMPTS = ["The meaning of life is"]


def default_new_tokens(n_positions: int) -> int:
    """A served answer's default length: short (a CPU answers in seconds), and
    at most half the positions, so the prompt keeps the other half."""
    return min(64, n_positions // 2)


def generation_params(n_positions: int) -> dict:
    """The params a caller may pass to predict, with their defaults (those of
    the export's generation_config.json: top-k 50 sampling)."""
    return {"max_new_tokens": default_new_tokens(n_positions), "temperature": 1.0, "top_k": 50, "top_p": 1.0,
            "do_sample": True}


def inference_config(n_positions: int) -> dict:
    """The pipeline arguments of every predict call (params override them).
    "hole": a prompt too long for the answer is cut from the left, to the
    last `n_positions - max_new_tokens` tokens, instead of running the model
    off its position table."""
    return {"max_new_tokens": default_new_tokens(n_positions), "handle_long_generation": "hole"}


def signature(n_positions: int):
    from mlflow.models import infer_signature

    return infer_signature(EXAMPLE_PROMPTS, ["an answer"], params=generation_params(n_positions))


def register_hf_model(tracker: Tracker, hf_dir: str | Path, name: str, alias: str | None = None, *,
                      export_id: str) -> int:
    """Log `hf_dir` to the tracker's run, register it as `name`, point `alias`
    at the new version, whose description is the directory's model card;
    returns the version. `export_id` names the exported files: a version of
    `name` already tagged with it (left by an attempt that died before its
    result was recorded) is reused, not registered again, if its files are
    still in the artifact store."""
    import mlflow

    if not tracker.flush(timeout=60) or tracker.run_id is None:
        raise RuntimeError(f"MLflow at {tracker.safe_uri} is unreachable; cannot register model {name!r}")
    client = mlflow.MlflowClient(tracking_uri=tracker.uri)
    version = registered_version(client, name, export_id)
    if version is not None and not version_files_present(client, name, version):
        version = None
    if version is None:
        version = _log_and_register(tracker, hf_dir, name, {EXPORT_TAG: export_id})
    else:
        log.info("%s version %s already holds export %s; reusing it", name, version, export_id)
    client.update_model_version(name, str(version), description=model_card_text(hf_dir, name, front_matter=False))
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
            n_positions = model.config.n_positions
            info = mlflow.transformers.log_model(
                {"model": model, "tokenizer": tokenizer}, name="hf", task="text-generation",
                registered_model_name=name, pip_requirements=PIP_REQUIREMENTS, tags=tags,
                model_card=_model_card(hf_dir, name), signature=signature(n_positions),
                input_example=(EXAMPLE_PROMPTS, {"max_new_tokens": 8}), model_config=inference_config(n_positions),
            )
    finally:
        mlflow.set_tracking_uri(None)  # clears the global and the variable
        if previous_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env
    return int(info.registered_model_version)


def _model_card(hf_dir: str | Path, name: str):
    """The model card MLflow stores beside the model: the export's. Without
    one MLflow asks the Hugging Face hub for the card of the model's name,
    here a local directory the hub never has, and warns on every export."""
    from huggingface_hub import ModelCard

    return ModelCard(model_card_text(hf_dir, name))


def model_card_text(hf_dir: str | Path, name: str, front_matter: bool = True) -> str:
    """The export's README.md (a bare card for a directory without one);
    without its metadata block for a version's description."""
    readme = Path(hf_dir) / "README.md"
    if readme.is_file():
        text = readme.read_text(encoding="utf-8")
    else:
        text = (f"---\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n# {name}\n\n"
                "GPT-2 trained from scratch by gpt2-pipeline.\n")
    if not front_matter and text.startswith("---\n"):
        text = text.split("\n---\n", 1)[1]
    return text.strip() + "\n"


def version_files_present(client, name: str, version: int) -> bool:
    """Whether the artifact store still holds `name` version `version`'s
    model (its MLmodel file); a warning names the version when it does not."""
    import mlflow

    uri = client.get_model_version_download_uri(name, str(version))
    try:
        if any(f.path.endswith("MLmodel") for f in mlflow.artifacts.list_artifacts(artifact_uri=uri)):
            return True
    except Exception as err:  # noqa: BLE001 - any failure to list is "not there" for this question
        log.debug("listing %s failed: %s", uri, redact(str(err)))
    log.warning("registered model %s version %s has no files left in the artifact store (%s); registering again",
                name, version, redact(uri))
    return False


def model_version_exists(config: Config, name: str, version: int) -> bool:
    """Whether this config's tracking store still has `name` version
    `version`, and its artifact store the version's files."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient(tracking_uri=default_tracking_uri(config))
        client.get_model_version(name, str(version))
        return version_files_present(client, name, version)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            log.warning("could not look up %s version %s (%s); registering again", name, version, redact(str(err)))
        return False
