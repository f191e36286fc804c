"""Prefect task of the evaluate stage: lm-eval's HellaSwag on one checkpoint,
logged to MLflow. Cached on the checkpoint's weights + the eval settings."""

from __future__ import annotations

from typing import Any

from prefect import task

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.config.identity import eval_fingerprint
from gpt2.config.tree import Config
from gpt2.eval.hellaswag import evaluate as evaluation
from tasks.common import CODE_VERSION, not_user_error
from tasks.tracking import checkpoint_tags, stage_run


def eval_key(_context: Any, parameters: dict) -> str:
    return f"evaluate-{eval_fingerprint(parameters['config'], parameters['ref'].model_sha256)}-{CODE_VERSION}"


@task(name="evaluate-hellaswag", cache_key_fn=eval_key, persist_result=True, retries=1, retry_delay_seconds=10,
      retry_condition_fn=not_user_error)
def evaluate_hellaswag(config: Config, ref: CheckpointRef, parent_run_id: str | None = None) -> dict[str, Any]:
    with stage_run(config, f"eval-{ref.run_name}-{ref.step_name}", "evaluate", parent_run_id,
                   tags=checkpoint_tags(ref)) as tracker:
        result = evaluation.evaluate_checkpoint(config, ref)
        tracker.log_params({"eval": config.eval.model_dump(mode="json"), "checkpoint": ref.url, "step": ref.step})
        tracker.log_metrics({f"hellaswag/{k}": v for k, v in result["hellaswag"].items() if v is not None}, step=ref.step)
        tracker.log_dict(result, "eval/hellaswag.json")
    return {**result, "mlflow_run_id": tracker.run_id}
