"""Stage flow `gpt2-eval`: lm-eval's HellaSwag on a checkpoint, cached.

    gpt2 evaluate --preset smoke --json                # via the CLI
    python -m flows.evaluate --preset smoke            # the flow directly

The checkpoint is the latest complete one of the preset's training run unless
one is named. A rerun on the same weights with the same eval settings is
Cached (and returns the same MLflow run id).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.entry import flow_main
from flows.ladder import left_state
from flows.stages import publish_result
from gpt2.checkpoint.ref import resolve_checkpoint
from gpt2.config.overrides import resolve_config
from gpt2.config.tree import Config
from gpt2.data.epoch import steps_for_checkpoint
from gpt2.root import storage
from gpt2.weights.init import with_resolved_init
from tasks.common import run_cached
from tasks.evaluate import evaluate_hellaswag


def run_eval_stage(config: Config, checkpoint: str | None = "latest", parent_run_id: str | None = None) -> dict[str, Any]:
    """Evaluate; returns the evaluation result plus `mlflow_run_id` and `cached`."""
    ref = resolve_checkpoint(config, checkpoint)
    get_run_logger().info("evaluating %s on %s", ref.url, config.eval.hellaswag_source)
    result, cached = run_cached(
        evaluate_hellaswag, config, ref, parent_run_id,
        valid=lambda r: storage.exists(r["result_url"]),
    )
    return {**result, "cached": cached}


@flow(name="gpt2-eval", log_prints=False)
def eval_flow(
    preset: str = "smoke",
    overrides: dict[str, Any] | None = None,
    root: str | None = None,
    checkpoint: str = "latest",
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """HellaSwag (lm-eval, checked against the native scorer) of a checkpoint."""
    config = steps_for_checkpoint(resolve_config(preset, overrides or {}, root=root), checkpoint)
    # A fine-tune's name counts its weights' sha256; a named checkpoint needs no name.
    config = with_resolved_init(config, fetching=False, required=checkpoint in (None, "", "latest"))
    if (left := left_state(config)) is not None:
        return left
    result = run_eval_stage(config, checkpoint, parent_run_id)
    publish_result(config, result)
    return result


def main() -> None:
    flow_main(eval_flow, __doc__, checkpoint="latest")


if __name__ == "__main__":
    main()
