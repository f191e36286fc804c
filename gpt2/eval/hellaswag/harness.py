"""Run lm-eval's `hellaswag` task (through gpt2.eval.harness): on the hub's data, or on a
local file through a task config generated at run time.

The generated config `include`s lm-eval's installed hellaswag.yaml (same
process_docs, prompt and metrics) and only swaps the data for
`dataset_path: json` over a local JSONL. The rows given are written there
first, so lm-eval scores exactly the items the native scorer scores.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import lm_eval
import numpy as np
from lm_eval.api.model import LM

from gpt2.eval.harness.run import run_task
from gpt2.eval.hellaswag.items import write_jsonl

log = logging.getLogger(__name__)

STOCK_TASK = "hellaswag"
FILE_TASK = "hellaswag_file"
METRICS = ("acc", "acc_norm")


def stock_task_yaml() -> Path:
    return Path(lm_eval.__file__).parent / "tasks" / "hellaswag" / "hellaswag.yaml"


def local_task(rows: Sequence[dict[str, Any]], work_dir: str | Path) -> Path:
    """Write `rows` and a task config over them under work_dir; return the
    directory to give lm-eval as include_path. Content-addressed, so a rerun
    reuses the directory (and the datasets cache keyed on it)."""
    data = write_jsonl(rows)
    task_dir = Path(work_dir) / "hellaswag-task" / hashlib.sha256(data).hexdigest()[:16]
    jsonl = task_dir / "hellaswag.jsonl"
    yaml_text = (
        f"include: {stock_task_yaml()}\n"
        f"task: {FILE_TASK}\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    validation: {jsonl.resolve()}\n"
        "training_split: null\n"
    )
    task_dir.mkdir(parents=True, exist_ok=True)
    for path, blob in ((jsonl, data), (task_dir / f"{FILE_TASK}.yaml", yaml_text.encode())):
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(blob)
        os.replace(tmp, path)  # a concurrent run never sees a partial file
    return task_dir


def run_hellaswag(
    model: LM | str,
    rows: Sequence[dict[str, Any]] | None,
    work_dir: str | Path,
    model_args: dict[str, Any] | None = None,
    limit: int | None = None,
    batch_size: int | str | None = None,
) -> dict[str, Any]:
    """Evaluate `model` (a GPTLM, or "hf" with model_args) on `rows` (None: the
    hub's Rowan/hellaswag validation split, first `limit` items).

    Returns {acc, acc_norm, acc_stderr, acc_norm_stderr, n, task, picks, raw}:
    `picks` holds lm-eval's per-item (pred, pred_norm) in document order,
    `raw` the task's result block with lm-eval's own (comma) keys."""
    # Index only lm-eval's hellaswag folder (plus our generated task), not its
    # thousands of task YAMLs: that index alone costs 10-20 s per evaluation.
    paths = [str(stock_task_yaml().parent)]
    if rows is None:
        task = STOCK_TASK
    else:
        task = FILE_TASK
        paths.append(str(local_task(rows, work_dir)))
        limit = None  # the file holds exactly the rows to score
    out = run_task(model, task, paths, defaults=False, model_args=model_args, limit=limit, batch_size=batch_size)
    result = {m: out["metrics"][m] for m in METRICS}
    result.update({f"{m}_stderr": out["metrics"].get(f"{m}_stderr") for m in METRICS})
    result.update(n=out["n"], task=task, picks=[_picks(s) for s in out["samples"]], raw=out["raw"])
    return result


def _picks(sample: dict[str, Any]) -> dict[str, Any]:
    # filtered_resps: one (loglikelihood, is_greedy) per ending.
    lls = np.array([float(r[0]) for r in sample["filtered_resps"]])
    chars = np.array([float(len(c)) for c in sample["doc"]["choices"]])
    return {
        "doc_id": sample["doc_id"],
        "loglikelihoods": lls.tolist(),
        "pred": int(np.argmax(lls)),
        "pred_norm": int(np.argmax(lls / chars)),
        "acc": float(sample["acc"]),
        "acc_norm": float(sample["acc_norm"]),
    }
