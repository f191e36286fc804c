"""The preflight before training (train.preflight): `gpt2 preflight` in a child
process on the training machine, its outcome in the flow's log and in MLflow
(a `preflight` stage run: `preflight/<figure>` metrics and `preflight.json`).
A failed preflight fails the task with the failed checks; it is not retried
(tasks.train) and, ending Failed rather than Crashed, not rescheduled."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from gpt2.config.tree import Config
from gpt2.preflight.child import PreflightFailed, run_child
from gpt2.root import layout
from tasks.tracking import stage_run


def preflight_first(config: Config, parent_run_id: str | None = None) -> dict[str, Any] | None:
    """Run the preflight when train.preflight asks for it; its result, or None when skipped."""
    logger = get_run_logger()
    if not config.train.preflight:
        return None
    if config.runtime.nnodes > 1:
        logger.warning("train.preflight: skipped for a multi-node run (runtime.nnodes=%d); run `torchrun ... -m "
                       "gpt2.preflight` on every node as the run starts", config.runtime.nnodes)
        return None
    logger.info("preflight of %s on this machine (train.preflight=false skips it)", layout.run_name(config))
    try:
        result, failed = run_child(config, logger.info), None
    except PreflightFailed as err:
        result, failed = err.result, err
    if result is not None:
        _track(config, result, parent_run_id)
    if failed is not None:
        raise failed
    return result


def _track(config: Config, result: dict[str, Any], parent_run_id: str | None) -> None:
    numbers = {f"preflight/{k}": float(v) for k, v in result.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    with stage_run(config, f"preflight-{layout.run_name(config)}", "preflight", parent_run_id,
                   tags={"preflight.failed": ",".join(result["failed"]) or "none"}, per_attempt=True) as t:
        t.log_metrics(numbers, step=0)
        t.log_dict(result, "preflight.json")
        if result["failed"]:
            t.close("FAILED")
