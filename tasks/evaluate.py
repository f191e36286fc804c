"""Prefect task of the evaluate stage: the tasks of eval.tasks on one checkpoint (lm-eval's
HellaSwag by default; CORE; any lm-eval task), logged to MLflow. Cached on the checkpoint's
weights + the eval settings."""

from __future__ import annotations

from typing import Any

from prefect import task

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.config.identity import eval_fingerprint
from gpt2.config.tree import Config
from gpt2.eval import evaluate as evaluation
from tasks.common import CODE_VERSION, not_user_error
from tasks.tracking import checkpoint_tags, stage_run


def eval_key(_context: Any, parameters: dict) -> str:
    return f"evaluate-{eval_fingerprint(parameters['config'], parameters['ref'].model_sha256)}-{CODE_VERSION}"


def result_metrics(result: dict[str, Any]) -> dict[str, float]:
    """MLflow metrics of an evaluation: hellaswag/acc_norm, core/score, core/<label>/centered,
    lm-eval/<task>/<metric> (names without commas: MLflow refuses them)."""
    metrics = {f"hellaswag/{k}": v for k, v in (result["hellaswag"] or {}).items()}
    for name, scored in (result.get("tasks") or {}).items():
        kind, _, label = name.partition(":")
        numbers = scored.get("metrics") or {k: scored.get(k) for k in ("acc", "centered", "acc_stderr", "centered_stderr")}
        metrics.update({f"{kind}/{label}/{k}": v for k, v in numbers.items()})
    if result.get("core"):
        metrics.update({"core/score": result["core"]["score"], "core/stderr": result["core"]["stderr"]})
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@task(name="evaluate-hellaswag", cache_key_fn=eval_key, persist_result=True, retries=1, retry_delay_seconds=10,
      retry_condition_fn=not_user_error)
def evaluate_hellaswag(config: Config, ref: CheckpointRef, parent_run_id: str | None = None) -> dict[str, Any]:
    with stage_run(config, f"eval-{ref.run_name}-{ref.step_name}", "evaluate", parent_run_id,
                   tags=checkpoint_tags(ref)) as tracker:
        result = evaluation.evaluate_checkpoint(config, ref)
        tracker.log_params({"eval": config.eval.model_dump(mode="json"), "checkpoint": ref.url, "step": ref.step})
        tracker.log_metrics(result_metrics(result), step=ref.step)
        tracker.log_dict(result, "eval/hellaswag.json")
    return {**result, "mlflow_run_id": tracker.run_id}
