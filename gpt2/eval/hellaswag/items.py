"""HellaSwag items: loading from the hub, a JSONL file, or the shipped format
sample, and lm-eval's `hellaswag` preprocessing.

`preprocess` and `Item.from_row` reproduce lm-eval's
`lm_eval/tasks/hellaswag/utils.py` character for character (a test compares
them with the installed lm-eval on every sample row), so the native scorer
and lm-eval see the same query and endings.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterable

from gpt2.errors import UserError
from gpt2.root import storage

log = logging.getLogger(__name__)

FORMAT_SAMPLE = "builtin:format-sample"
"""A 31-item file in the original HellaSwag format written for this project to
exercise the format (WikiHow brackets, empty ctx_b, non-ASCII endings). It is
NOT the benchmark: its numbers say nothing about a model."""

HUB_DATASET = "Rowan/hellaswag"
HUB_SOURCES = (HUB_DATASET, f"hf://datasets/{HUB_DATASET}")
"""Sources meaning "the hub's validation split" (10,042 items)."""

N_ENDINGS = 4
REQUIRED_FIELDS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")


class HellaSwagDataError(UserError, ValueError):
    """A HellaSwag source is unreadable or a row is malformed; names the row."""


def preprocess(text: str) -> str:
    """lm-eval's clean-up: WikiHow `[title]` becomes a sentence break, other
    bracketed markers go, double spaces collapse once (as lm-eval does)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


@dataclass(frozen=True)
class Item:
    """One HellaSwag question after lm-eval's preprocessing."""

    query: str
    """Context the endings continue: `activity_label: ctx_a Ctx_b`, cleaned."""
    endings: tuple[str, ...]
    """The four candidate endings, cleaned (scored after a single space)."""
    label: int
    """Index of the correct ending."""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Item":
        ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
        return cls(
            query=preprocess(row["activity_label"] + ": " + ctx),
            endings=tuple(preprocess(e) for e in row["endings"]),
            label=int(row["label"]),
        )


def check_row(row: Any, where: str) -> dict[str, Any]:
    """Reject what lm-eval would silently score as wrong (a label out of range
    is counted as a miss there): every problem of the row in one error."""
    if not isinstance(row, dict):
        raise HellaSwagDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    problems = [f"missing field {f!r}" for f in REQUIRED_FIELDS if f not in row]
    for field in ("activity_label", "ctx_a", "ctx_b"):
        if field in row and not isinstance(row[field], str):
            problems.append(f"{field!r} must be a string")
    endings = row.get("endings")
    if "endings" in row and not (
        isinstance(endings, list) and len(endings) == N_ENDINGS and all(isinstance(e, str) and e.strip() for e in endings)
    ):
        problems.append(f"'endings' must be a list of {N_ENDINGS} non-empty strings")
    if "label" in row:
        label = row["label"]
        ok = isinstance(label, int) and not isinstance(label, bool) or isinstance(label, str) and label.isdigit()
        if not ok or not 0 <= int(label) < N_ENDINGS:
            problems.append(f"label {label!r} out of range: must be 0..{N_ENDINGS - 1}")
    if problems:
        raise HellaSwagDataError(f"{where}: " + "; ".join(problems))
    return row


def parse_jsonl(text: str, name: str) -> list[dict[str, Any]]:
    """Rows of a HellaSwag JSONL; the error names the file and line."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise HellaSwagDataError(f"{name} line {lineno}: not valid JSON ({err.msg})") from None
        rows.append(check_row(row, f"{name} line {lineno}"))
    if not rows:
        raise HellaSwagDataError(f"{name}: no HellaSwag rows")
    return rows


def format_sample_text() -> str:
    return (resources.files("gpt2.eval.hellaswag") / "format_sample.jsonl").read_text(encoding="utf-8")


def _hub_rows() -> list[dict[str, Any]]:
    # Needs network access to the Hugging Face hub (or its local cache).
    import datasets

    split = datasets.load_dataset(HUB_DATASET, split="validation")
    return [check_row(dict(r), f"{HUB_DATASET} validation row {i}") for i, r in enumerate(split)]


def load_rows(source: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Raw validated rows of `source` (hub, fsspec URL of a JSONL, or the format
    sample), the first `limit` only when given."""
    if source in HUB_SOURCES:
        rows = _hub_rows()
    elif source == FORMAT_SAMPLE:
        log.warning("%s is a small format sample written for this project, not the HellaSwag benchmark", source)
        rows = parse_jsonl(format_sample_text(), source)
    elif source.startswith("builtin:"):
        raise HellaSwagDataError(f"unknown builtin HellaSwag source {source!r}; the only one is {FORMAT_SAMPLE}")
    else:
        try:
            text = storage.read_bytes(storage.normalize_url(source)).decode("utf-8")
        except FileNotFoundError:
            raise HellaSwagDataError(f"HellaSwag file {source} does not exist") from None
        except UnicodeDecodeError as err:
            raise HellaSwagDataError(f"HellaSwag file {source} is not UTF-8 text ({err})") from None
        rows = parse_jsonl(text, source)
    return rows[:limit] if limit else rows


def load_items(source: str, limit: int | None = None) -> list[Item]:
    """Preprocessed items of `source`, ready for `gpt2.eval.hellaswag.scorer`."""
    return [Item.from_row(r) for r in load_rows(source, limit)]


def write_jsonl(rows: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
