"""CORE of a model: each task's accuracy, its centered accuracy `(acc - b) / (1 - b)` against the
task's random baseline b, and CORE, the mean of the centered accuracies (DCLM; nanochat's
`base_eval.py`). Standard errors are binomial per task and propagated through the mean.

    record = fetch(root, config.eval.core_bundle)                 # gpt2.eval.core.fetch
    result = score_task(model, record, task, device, batch_size, max_per_task)
    core = combine([result, ...])
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import torch.nn as nn

from gpt2.eval.core.bundle import CoreTask, parse_items
from gpt2.eval.core.fetch import read_file
from gpt2.eval.core.prompts import examples, subsample
from gpt2.eval.core.scorer import timed
from gpt2.tokenizer import get_encoding

log = logging.getLogger(__name__)


def centered(acc: float, baseline: float) -> float:
    return (acc - baseline) / (1.0 - baseline)


def _stderr(acc: float, n: int) -> float | None:
    return math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else None


def task_result(task: CoreTask, correct: Sequence[bool]) -> dict[str, Any]:
    n = len(correct)
    acc = sum(correct) / n
    stderr = _stderr(acc, n)
    return {"acc": acc, "centered": centered(acc, task.baseline), "acc_stderr": stderr,
            "centered_stderr": None if stderr is None else stderr / (1.0 - task.baseline),
            "baseline": task.baseline, "n": n, "kind": task.kind, "num_fewshot": task.num_fewshot}


def score_task(model: nn.Module, record: dict, task: CoreTask, device: Any, batch_size: int = 8,
               max_per_task: int | None = None) -> dict[str, Any]:
    """One task of a fetched bundle (gpt2.eval.core.fetch), its items read from the checked copy."""
    items = parse_items(task, read_file(record, task.data_path).decode("utf-8"), record["source"])
    ready = examples(task, subsample(items, max_per_task), get_encoding("gpt2"), model.config.block_size,
                     record["source"])
    decisions, rate = timed(model, ready, device, batch_size)
    result = task_result(task, [d.correct for d in decisions])
    log.info("CORE %s: acc %.4f, centered %.4f (%d items, %.1f items/s)", task.label, result["acc"],
             result["centered"], result["n"], rate)
    return {**result, "items_per_s": rate}


def combine(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """CORE from the tasks' results (by label): the mean centered accuracy and its stderr."""
    values = [r["centered"] for r in results.values()]
    errors = [r.get("centered_stderr") for r in results.values()]
    stderr = math.sqrt(sum(e * e for e in errors)) / len(errors) if errors and None not in errors else None
    return {"score": sum(values) / len(values), "stderr": stderr, "tasks": len(values)}
