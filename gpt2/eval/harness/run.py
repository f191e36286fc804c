"""lm-eval's own task code on a model: any task of its index, or of a folder of task YAMLs.

    run_task(GPTLM(model), "arc_easy")                                 # a stock task (its data from the hub)
    run_task(GPTLM(model), "my_task", include_path="/tasks", defaults=False)   # a local YAML task

The numbers are lm-eval's: its prompts, requests and metrics, read back from its result block
with the filter suffix dropped (`acc,none` is `acc`; MLflow refuses commas in metric names).
"""

from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import Any, Sequence

import lm_eval
from lm_eval.api.model import LM

from gpt2.errors import UserError
from gpt2.eval.harness.model import UnsupportedRequest

log = logging.getLogger(__name__)


class LmEvalTaskError(UserError, ValueError):
    """An `lm-eval:<task>` that lm-eval does not know, or asks for what our model does not do."""


def task_manager(include_path: str | Path | Sequence[str | Path] | None, defaults: bool):
    """lm-eval's task index over `include_path` (and its own thousands of task YAMLs when
    `defaults`: indexing those alone costs 10-20 s, so a local task is looked up without them)."""
    from lm_eval.tasks import TaskManager

    paths = [include_path] if isinstance(include_path, (str, Path)) else list(include_path or [])
    return TaskManager(include_path=[str(p) for p in paths] or None, include_defaults=defaults)


def find_task(task: str, include_path: str | Path | None):
    """The index that holds `task`: the include folder alone when it does, else with lm-eval's
    own tasks; LmEvalTaskError with the closest names when none does."""
    if include_path is not None:
        local = task_manager(include_path, defaults=False)
        if task in local.all_tasks:
            return local
    manager = task_manager(include_path, defaults=True)
    if task not in manager.all_tasks:
        close = difflib.get_close_matches(task, manager.all_tasks, n=5, cutoff=0.6)
        hint = f"closest: {', '.join(close)}" if close else "`lm-eval ls tasks` lists them"
        where = f" (nor in eval.lm_eval_include={include_path})" if include_path is not None else ""
        raise LmEvalTaskError(f"eval.tasks: lm-eval:{task} is not an lm-eval task{where}; {hint}")
    return manager


def metric_name(key: str) -> str:
    """`acc,none` -> `acc`; another filter keeps its name (`exact_match,strict-match` ->
    `exact_match/strict-match`)."""
    name, _, flt = key.partition(",")
    return name if flt in ("", "none") else f"{name}/{flt}"


def metrics_of(block: dict[str, Any]) -> dict[str, float | None]:
    """The numbers of one task's result block, by metric name (stderr as `<metric>_stderr`)."""
    out: dict[str, float | None] = {}
    for key, value in block.items():
        if key == "alias" or "," not in key:
            continue
        try:
            out[metric_name(key)] = float(value)
        except (TypeError, ValueError):
            out[metric_name(key)] = None  # lm-eval reports "N/A" when it cannot bootstrap
    return out


def run_task(model: LM | str, task: str, include_path: str | Path | Sequence[str | Path] | None = None,
             defaults: bool = True, model_args: dict[str, Any] | None = None, limit: int | None = None,
             batch_size: int | str | None = None, manager: Any = None) -> dict[str, Any]:
    """lm-eval's `task` on `model` (an lm-eval LM, or a registry name like "hf" with model_args).

    Returns {task, metrics, n, samples, raw}: `metrics` by name (see metrics_of), `samples`
    lm-eval's per-document records in document order, `raw` its result block."""
    manager = manager or task_manager(include_path, defaults)
    try:
        out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task], task_manager=manager,
                                      limit=limit, batch_size=batch_size, log_samples=True, bootstrap_iters=1000)
    except UnsupportedRequest as err:
        raise LmEvalTaskError(f"eval.tasks: lm-eval:{task} asks for {err.kind} requests, which our model's lm-eval "
                              "wrapper does not do (it scores log-likelihoods: multiple-choice and cloze tasks); "
                              "run it with `lm-eval --model hf` on the export instead") from None
    block = out["results"][task]
    # A group (mmlu) has no samples of its own: its subtasks' are under their names.
    samples = sorted(out["samples"].get(task, []), key=lambda s: s["doc_id"])
    counted = out.get("n-samples", {}).get(task, {}).get("effective")
    return {"task": task, "metrics": metrics_of(block), "n": len(samples) or counted, "samples": samples,
            "raw": _jsonable(block)}


def _jsonable(block: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (str, int, float, bool, type(None))) else str(v)) for k, v in block.items()}
