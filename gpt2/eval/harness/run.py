"""lm-eval's own task code on a model: any task of its index, or of a folder of task YAMLs.

    run_task(GPTLM(model), "arc_easy")                                 # a stock task (its data from the hub)
    run_task(GPTLM(model), "my_task", include_path="/tasks", defaults=False)   # a local YAML task

The numbers are lm-eval's: its prompts, requests and metrics, read back from its result block
with the filter suffix dropped (`acc,none` is `acc`; MLflow refuses commas in metric names).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

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
    own tasks; LmEvalTaskError with the closest names when none does. A name that is in neither
    is refused from default_task_names, without indexing lm-eval's own tasks (a typo is told in
    about a second, not 10-20 s)."""
    local_names: list[str] = []
    if include_path is not None:
        local = task_manager(include_path, defaults=False)
        if task in local.all_tasks:
            return local
        local_names = local.all_tasks
    names = default_task_names()
    if task not in names:
        close = difflib.get_close_matches(task, sorted({*local_names, *names}), n=5, cutoff=0.6)
        hint = f"closest: {', '.join(close)}" if close else "`lm-eval ls tasks` lists them"
        where = f" (nor in eval.lm_eval_include={include_path})" if include_path is not None else ""
        raise LmEvalTaskError(f"eval.tasks: lm-eval:{task} is not an lm-eval task{where}; {hint}")
    return task_manager(include_path, defaults=True)


_IGNORED_DIRS = {"__pycache__", ".ipynb_checkpoints"}  # as lm-eval's TaskIndex skips them


def default_task_names() -> list[str]:
    """The names (tasks, groups, tags) of lm-eval's own task index, which takes 10-20 s to build:
    kept in the user's cache (indexed_names)."""
    spec = importlib.util.find_spec("lm_eval.tasks")
    root = Path(next(iter(spec.submodule_search_locations)))
    return indexed_names(root, f"lm-eval-{lm_eval.__version__}", lambda: task_manager(None, defaults=True).all_tasks)


def indexed_names(root: Path, label: str, index: Callable[[], list[str]]) -> list[str]:
    """`index()`, the names of an lm-eval task index over `root`, kept in the user's cache under
    `label` and a fingerprint of the YAML files under `root` (path, size, modification time: a
    fraction of a second to read for lm-eval's 14k), so a task file edited, added or removed makes
    a new list instead of a stale one. A damaged list is made again."""
    digest = hashlib.sha256(label.encode())
    for path in sorted(p for p in root.glob("**/*.yaml") if not _IGNORED_DIRS.intersection(p.parts)):
        st = path.stat()
        digest.update(f"\0{path.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}".encode())

    def make(file: Path) -> None:
        names = index()
        file.write_text(json.dumps({"names": names, "sha256": _names_digest(names)}))

    from gpt2.tracking.store import cached_file

    file = None
    try:
        file = cached_file(f"{label}-tasks-{digest.hexdigest()[:16]}.json", make)
        kept = json.loads(file.read_text())
        if _names_digest(kept["names"]) != kept["sha256"]:  # a changed byte would refuse a real task
            raise ValueError("its checksum does not match")
        return kept["names"]
    except OSError as err:  # a cache it cannot write
        log.debug("task names not cached (%s)", err)
    except (ValueError, KeyError, TypeError) as err:
        log.warning("the cached task names %s are damaged (%s): indexing the tasks again", file, err)
        if file is not None:
            file.unlink(missing_ok=True)
    return index()


def _names_digest(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


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
