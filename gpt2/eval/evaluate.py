"""The evaluate stage's work on one checkpoint: every task of `eval.tasks`, one result file.

    {root}/runs/{run}/eval/step_000060/hellaswag.json                  the result (its historic name)
    {root}/runs/{run}/eval/step_000060/tasks/<settings>/<task>.json    each task's, as it finishes

- `hellaswag`: lm-eval's numbers checked against the native scorer (gpt2.eval.hellaswag.evaluate),
  under the result's `hellaswag`, `native`, `parity`, `lm_eval`, `source`, `benchmark` as before;
  all of them None when HellaSwag is not asked for.
- `core`, `core:<label>`: CORE's tasks (gpt2.eval.core) under `tasks["core:<label>"]` (acc,
  centered, their stderr, baseline, n); `core` also the score under `core` (score, stderr, tasks).
- `lm-eval:<task>`: lm-eval's own numbers on our model under `tasks["lm-eval:<task>"]` (its
  metrics by name, acc and acc_stderr where the task has them, n).

A task's result is kept as soon as it is scored, so an evaluation preempted part way scores only
the tasks it had not finished when it runs again.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch.nn as nn

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.checkpoint.store import load_model
from gpt2.config.identity import EVAL_FORMAT_VERSION, fingerprint
from gpt2.config.tree import Config
from gpt2.eval.core.bundle import select
from gpt2.eval.core.fetch import fetch, fetched_tasks
from gpt2.eval.core.score import combine, score_task
from gpt2.eval.hellaswag.evaluate import hellaswag_result, result_url
from gpt2.process.distributed import pick_device
from gpt2.root import layout, storage

log = logging.getLogger(__name__)

HELLASWAG_KEYS = ("hellaswag", "native", "parity", "lm_eval", "source", "benchmark")


def _kept(url: str, score: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A task's result: read back when an earlier attempt finished it, else scored and kept."""
    done = storage.read_record(url)
    if done is not None:
        log.info("kept from an earlier attempt: %s", url)
        return done
    result = score()
    storage.write_record(url, result)
    return result


def core_labels(tasks: tuple[str, ...]) -> list[str] | None:
    """The CORE tasks asked for: None for all (`core`), else the `core:<label>` ones in order."""
    if "core" in tasks:
        return None
    return [t.partition(":")[2] for t in tasks if t.startswith("core:")]


def _core(config: Config, model: nn.Module, device: Any, kept: Callable) -> tuple[dict[str, Any], dict | None]:
    cfg = config.eval
    record = fetch(layout.root(config), cfg.core_bundle)
    chosen = select(fetched_tasks(record), core_labels(cfg.tasks), cfg.core_bundle)
    results = {}
    for task in chosen:
        settings = {"bundle": record["sha256"], "max_per_task": cfg.max_per_task, "task": task.label}
        results[f"core:{task.label}"] = kept(f"core:{task.label}", settings, lambda t=task: score_task(
            model, record, t, device, cfg.batch_size, cfg.max_per_task))
    core = None
    if "core" in cfg.tasks:
        core = {**combine(results), "bundle": cfg.core_bundle, "bundle_sha256": record["sha256"],
                "max_per_task": cfg.max_per_task}
    return results, core


def _lm_eval(config: Config, model: nn.Module, device: Any, task: str) -> dict[str, Any]:
    from gpt2.eval.harness.model import GPTLM
    from gpt2.eval.harness.run import find_task, run_task

    include = config.eval.lm_eval_include
    manager = find_task(task, storage.local_path(storage.normalize_url(include)) if include else None)
    out = run_task(GPTLM(model, device, batch_size=4 * config.eval.batch_size), task, manager=manager,
                   limit=config.eval.limit)
    metrics = out["metrics"]
    return {"acc": metrics.get("acc"), "acc_stderr": metrics.get("acc_stderr"), "metrics": metrics, "n": out["n"]}


def evaluate_checkpoint(config: Config, ref: CheckpointRef) -> dict[str, Any]:
    """Score every task of eval.tasks on the checkpoint; write and return the result (see module
    docstring)."""
    device = pick_device(config.runtime.device)
    model, _ = load_model(ref.url, str(device))
    eval_dir = ref.output_dir(config.runtime.root, "eval")

    def kept(task: str, settings: dict[str, Any], score: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        key = fingerprint({**settings, "weights": ref.model_sha256, "format": EVAL_FORMAT_VERSION})
        return _kept(layout.eval_task_result(eval_dir, key, task), score)

    result: dict[str, Any] = dict.fromkeys(HELLASWAG_KEYS)
    tasks = config.eval.tasks
    if "hellaswag" in tasks:
        settings = {"task": "hellaswag", "source": config.eval.hellaswag_source, "limit": config.eval.limit}
        result.update(kept("hellaswag", settings, lambda: hellaswag_result(config, model, device)))
    per_task: dict[str, Any] = {}
    core = None
    if any(t == "core" or t.startswith("core:") for t in tasks):
        per_task, core = _core(config, model, device, kept)
    for task in (t.partition(":")[2] for t in tasks if t.startswith("lm-eval:")):
        settings = {"task": f"lm-eval:{task}", "include": config.eval.lm_eval_include, "limit": config.eval.limit}
        per_task[f"lm-eval:{task}"] = kept(f"lm-eval:{task}", settings, lambda t=task: _lm_eval(config, model, device, t))
    result.update(tasks=per_task, core=core, checkpoint=ref.url, step=ref.step, model_sha256=ref.model_sha256,
                  format=EVAL_FORMAT_VERSION)
    url = result_url(ref, config.runtime.root)
    storage.write_record(url, result)
    result["result_url"] = url
    return result
