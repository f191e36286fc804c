"""The CORE eval bundle as DCLM and nanochat ship it, read and checked:

    core.yaml            icl_tasks: per task a label, icl_task_type (multiple_choice | schema |
                         language_modeling), dataset_uri (under eval_data/), num_fewshot (a list:
                         the first is used) and continuation_delimiter (a space when absent)
    eval_meta_data.csv   `Eval Task` and `Random baseline` (percent) per task
    eval_data/*.jsonl    the items: multiple_choice {query, choices, gold};
                         schema {context_options, continuation, gold}; language_modeling
                         {context, continuation}

Every problem is refused by name (the bundle and the task), before a model is loaded.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from gpt2.errors import UserError

CONFIG, META, DATA_DIR = "core.yaml", "eval_meta_data.csv", "eval_data"
KINDS = ("multiple_choice", "schema", "language_modeling")
FIELDS = {"multiple_choice": ("query", "choices", "gold"), "schema": ("context_options", "continuation", "gold"),
          "language_modeling": ("context", "continuation")}
OPTIONS = {"multiple_choice": "choices", "schema": "context_options"}


class CoreBundleError(UserError, ValueError):
    """A CORE bundle that cannot be used: names the bundle, the task and what is wrong."""


@dataclass(frozen=True)
class CoreTask:
    label: str
    kind: str
    """multiple_choice, schema or language_modeling."""
    dataset_uri: str
    """The task's JSONL, relative to eval_data/."""
    num_fewshot: int
    delimiter: str
    """Between a context and its continuation."""
    baseline: float
    """Accuracy of guessing, as a fraction (the CSV holds percent)."""

    @property
    def data_path(self) -> str:
        return f"{DATA_DIR}/{self.dataset_uri}"


def _fewshot(value: Any) -> int:
    shots = value[0] if isinstance(value, list) and value else value
    if not isinstance(shots, int) or isinstance(shots, bool) or shots < 0:
        raise ValueError(f"num_fewshot must be a count (or a list of them), not {value!r}")
    return shots


def parse_baselines(text: str, bundle: str) -> dict[str, float]:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or not {"Eval Task", "Random baseline"} <= set(rows[0]):
        raise CoreBundleError(f"CORE bundle {bundle}: {META} needs the columns 'Eval Task' and 'Random baseline'")
    try:
        return {r["Eval Task"].strip(): float(r["Random baseline"]) / 100.0 for r in rows}
    except (TypeError, ValueError) as err:
        raise CoreBundleError(f"CORE bundle {bundle}: {META} holds a baseline that is not a number ({err})") from None


def parse_tasks(config_text: str, meta_text: str, bundle: str) -> tuple[CoreTask, ...]:
    """The tasks of core.yaml with their baselines; CoreBundleError naming the task otherwise."""
    try:
        entries = (yaml.safe_load(config_text) or {}).get("icl_tasks")
    except (yaml.YAMLError, AttributeError) as err:
        raise CoreBundleError(f"CORE bundle {bundle}: {CONFIG} is not a YAML mapping ({str(err)[:120]})") from None
    if not isinstance(entries, list) or not entries:
        raise CoreBundleError(f"CORE bundle {bundle}: {CONFIG} lists no icl_tasks")
    baselines = parse_baselines(meta_text, bundle)
    tasks = []
    for n, entry in enumerate(entries):
        label = entry.get("label") if isinstance(entry, dict) else None
        where = f"CORE bundle {bundle}, task {label or f'#{n}'}"
        if not label or not isinstance(label, str):
            raise CoreBundleError(f"{where}: {CONFIG} gives it no label")
        kind = entry.get("icl_task_type")
        if kind not in KINDS:
            raise CoreBundleError(f"{where}: unknown icl_task_type {kind!r}; known: {', '.join(KINDS)}")
        if label not in baselines:
            raise CoreBundleError(f"{where}: {META} has no random baseline for it")
        try:
            shots = _fewshot(entry.get("num_fewshot", 0))
        except ValueError as err:
            raise CoreBundleError(f"{where}: {err}") from None
        if not isinstance(entry.get("dataset_uri"), str):
            raise CoreBundleError(f"{where}: {CONFIG} gives it no dataset_uri")
        tasks.append(CoreTask(label, kind, entry["dataset_uri"], shots, str(entry.get("continuation_delimiter", " ")),
                              baselines[label]))
    return tuple(tasks)


def select(tasks: tuple[CoreTask, ...], labels: list[str] | None, bundle: str) -> tuple[CoreTask, ...]:
    """The tasks named (None: every one), in the bundle's order; an unknown label is refused
    with the closest names."""
    if labels is None:
        return tasks
    known = {t.label: t for t in tasks}
    for label in labels:
        if label not in known:
            close = difflib.get_close_matches(label, known, n=3, cutoff=0.5)
            hint = f"closest: {', '.join('core:' + c for c in close)}" if close else f"the bundle has {len(known)} tasks"
            raise CoreBundleError(f"eval.tasks: core:{label} is not a task of CORE bundle {bundle}; {hint}")
    return tuple(t for t in tasks if t.label in labels)


def _check_item(task: CoreTask, item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise CoreBundleError(f"{where}: expected a JSON object")
    missing = [f for f in FIELDS[task.kind] if f not in item]
    if missing:
        raise CoreBundleError(f"{where}: a {task.kind} item needs {', '.join(missing)}")
    if task.kind in OPTIONS:
        options, gold = item[OPTIONS[task.kind]], item["gold"]
        if not isinstance(options, list) or not options:
            raise CoreBundleError(f"{where}: {OPTIONS[task.kind]} must be a non-empty list")
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(options):
            raise CoreBundleError(f"{where}: gold {gold!r} is not an index of its {len(options)} options")
    return item


def parse_items(task: CoreTask, text: str, bundle: str) -> list[dict[str, Any]]:
    """The task's items in file order; the error names the bundle, the task and the line."""
    items = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"CORE bundle {bundle}, task {task.label}: {task.data_path} line {lineno}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise CoreBundleError(f"{where}: not valid JSON ({err.msg})") from None
        items.append(_check_item(task, item, where))
    if not items:
        raise CoreBundleError(f"CORE bundle {bundle}, task {task.label}: {task.data_path} holds no items")
    if task.num_fewshot >= len(items):
        raise CoreBundleError(f"CORE bundle {bundle}, task {task.label}: {task.num_fewshot}-shot needs more than "
                              f"{len(items)} items")
    return items


def read_bundle(read: Callable[[str], bytes | None], bundle: str) -> tuple[tuple[CoreTask, ...], dict[str, bytes]]:
    """The tasks of a bundle whose files `read` returns by relative path (None: absent), and the
    bytes of every file they need; CoreBundleError naming the first file that is missing."""
    files = {}
    for name in (CONFIG, META):
        data = read(name)
        if data is None:
            raise CoreBundleError(f"CORE bundle {bundle} has no {name}: give eval.core_bundle a directory or zip "
                                  f"holding {CONFIG}, {META} and {DATA_DIR}/ (nanochat's eval_bundle.zip)")
        files[name] = data
    tasks = parse_tasks(files[CONFIG].decode("utf-8"), files[META].decode("utf-8"), bundle)
    for task in tasks:
        data = read(task.data_path)
        if data is None:
            raise CoreBundleError(f"CORE bundle {bundle}, task {task.label}: {task.data_path} is missing; the bundle "
                                  "is incomplete (fetch it again, or give another eval.core_bundle)")
        files[task.data_path] = data
    return tasks, files
