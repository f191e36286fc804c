"""Prefect tasks of the export stage: write the HF + llm.c export of a
checkpoint (cached on its weights), then log and register the HF model in
MLflow (cached on the weights + the registry name and alias)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefect import task

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.config.identity import export_files_fingerprint, register_fingerprint
from gpt2.config.tree import Config
from gpt2.export import writer
from gpt2.root import storage
from tasks.common import CODE_VERSION, not_user_error
from tasks.registry import register_hf_model
from tasks.tracking import checkpoint_tags, stage_run


def files_key(_context: Any, parameters: dict) -> str:
    return f"export-{export_files_fingerprint(parameters['ref'].model_sha256)}-{CODE_VERSION}"


def register_key(_context: Any, parameters: dict) -> str:
    # The model card (the version's description) changes with a later evaluation.
    card = parameters["export"].get("card_eval") or "none"
    weights = register_fingerprint(parameters["config"], parameters["ref"].model_sha256)
    return f"register-{weights}-{card}-{CODE_VERSION}"


@task(name="export-checkpoint", cache_key_fn=files_key, persist_result=True, retries=1, retry_delay_seconds=10,
      retry_condition_fn=not_user_error)
def export_checkpoint(config: Config, ref: CheckpointRef) -> dict[str, Any]:
    return writer.export_checkpoint(ref, config.runtime.root, config.runtime.work_root).to_dict()


@task(name="register-model", cache_key_fn=register_key, persist_result=True)
def register_model(config: Config, ref: CheckpointRef, export: dict[str, Any], parent_run_id: str | None = None) -> dict[str, Any]:
    name, alias = config.export.registered_model, config.export.alias
    with stage_run(config, f"export-{ref.run_name}-{ref.step_name}", "export", parent_run_id,
                   tags=checkpoint_tags(ref)) as tracker:
        tracker.log_params({"export": config.export.model_dump(mode="json"), "checkpoint": ref.url, "step": ref.step})
        tracker.log_dict(export, "export/manifest.json")
        config.runtime.work_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=config.runtime.work_root) as tmp:
            local = _local_copy(export["hf_dir"], Path(tmp))
            writer.verify_hf_copy(export["export_dir"], local)  # a damaged file is named, never registered
            version = register_hf_model(tracker, local, name, alias,
                                        export_id=export_files_fingerprint(ref.model_sha256))
    return {"registered_model": name, "model_version": version, "alias": alias, "mlflow_run_id": tracker.run_id}


def _local_copy(url: str, tmp: Path) -> Path:
    """The HF directory on local disk (downloaded when the root is remote)."""
    local = storage.local_path(url)
    if local is not None:
        return local
    for name in storage.list_dir(url):
        storage.get_file(storage.join(url, name), tmp / name)
    return tmp
