"""CORE items as token rows, the way DCLM's evaluation (and nanochat's `core_eval.py`) builds
them, so our numbers sit beside published CORE scores:

- the task's items are shuffled with Random(1337) before any `max_per_task` cut;
- item i draws its few-shot examples with Random(1234 + i) from the other items (of the cut);
- each example is `context<delimiter>continuation` followed by a blank line; the item's prompt
  follows them (language modelling trims each context, and the prompt without its continuation);
- every row starts with BOS (GPT-2's <|endoftext|>) and is cropped from the left to the
  model's context, the continuation's place moving with it;
- multiple choice: one row per choice, the continuation is what follows the rows' common prefix;
  schema: one row per context option, the continuation is their common suffix; language
  modelling: one row, the continuation is what the prompt adds after the prompt without it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import tiktoken

from gpt2.eval.core.bundle import CoreBundleError, CoreTask
from gpt2.eval.logprobs import encode
from gpt2.tokenizer import EOT_TOKEN

SHUFFLE_SEED, FEWSHOT_SEED = 1337, 1234


@dataclass(frozen=True)
class Example:
    """One item ready to score: its rows (one per option; one for language modelling)."""

    rows: tuple[tuple[int, ...], ...]
    """Token ids, BOS first, cropped to the context."""
    starts: tuple[int, ...]
    """Per row, where its continuation starts; it runs to the row's end."""
    gold: int | None
    """The right option (None for language modelling)."""


def subsample(items: Sequence[dict[str, Any]], max_per_task: int | None) -> list[dict[str, Any]]:
    """The items a task scores: shuffled with a fixed seed, then cut (None: all)."""
    data = list(items)
    random.Random(SHUFFLE_SEED).shuffle(data)
    return data[:max_per_task] if max_per_task else data


def fewshot(items: Sequence[dict[str, Any]], index: int, shots: int) -> list[dict[str, Any]]:
    if shots == 0:
        return []
    others = [i for i in range(len(items)) if i != index]
    return [items[i] for i in random.Random(FEWSHOT_SEED + index).sample(others, shots)]


def render(task: CoreTask, item: dict[str, Any], shots: Sequence[dict[str, Any]]) -> list[str]:
    """The prompts of one item: one per option; for language modelling [without, with] its
    continuation."""
    d = task.delimiter
    if task.kind == "multiple_choice":
        head = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}\n\n" for s in shots)
        return [f"{head}{item['query']}{d}{choice}" for choice in item["choices"]]
    if task.kind == "schema":
        head = "".join(f"{s['context_options'][s['gold']]}{d}{s['continuation']}\n\n" for s in shots)
        return [f"{head}{option}{d}{item['continuation']}" for option in item["context_options"]]
    head = "".join(f"{str(s['context']).strip()}{d}{s['continuation']}\n\n" for s in shots)
    prompt = f"{head}{str(item['context']).strip()}{d}"
    # Stripped so a trailing delimiter is not a token of its own before the continuation.
    return [prompt.strip(), prompt + str(item["continuation"])]


def _common(rows: Sequence[Sequence[int]], backwards: bool) -> int:
    """Length of the prefix (or suffix) every row shares."""
    seqs = [list(reversed(r)) if backwards else list(r) for r in rows]
    n = 0
    while n < min(map(len, seqs)) and all(s[n] == seqs[0][n] for s in seqs):
        n += 1
    return n


def tokenize(task: CoreTask, prompts: list[str], enc: tiktoken.Encoding) -> tuple[list[list[int]], list[int]]:
    rows = [[EOT_TOKEN] + encode(enc, p) for p in prompts]
    if task.kind == "multiple_choice":
        start = _common(rows, backwards=False)
        return rows, [start] * len(rows)
    if task.kind == "schema":
        suffix = _common(rows, backwards=True)
        return rows, [len(r) - suffix for r in rows]
    without, whole = rows
    # The prompt without the continuation is a prefix of the whole in token space for every
    # bundle item seen; where a merge across the boundary breaks that, the shared part counts.
    return [whole], [_common([without, whole], backwards=False)]


def crop(rows: list[list[int]], starts: list[int], max_len: int, where: str) -> tuple[tuple, tuple]:
    out_rows, out_starts = [], []
    for row, start in zip(rows, starts):
        drop = max(0, len(row) - max_len)
        if start - drop < 1:
            raise CoreBundleError(f"{where}: its continuation is longer than the model's {max_len}-token context")
        out_rows.append(tuple(row[drop:]))
        out_starts.append(start - drop)
    return tuple(out_rows), tuple(out_starts)


def examples(task: CoreTask, items: Sequence[dict[str, Any]], enc: tiktoken.Encoding, max_len: int,
             bundle: str = "", only: Sequence[int] | None = None) -> list[Example]:
    """Every item of `items` (already subsampled) as an Example; `only`: those at these indices (a
    rank's share), each with the few-shot draws it gets among all of `items`."""
    if task.num_fewshot >= len(items):
        raise CoreBundleError(f"CORE bundle {bundle}, task {task.label}: {task.num_fewshot}-shot needs more than "
                              f"the {len(items)} items scored; raise eval.max_per_task")
    out = []
    for i in range(len(items)) if only is None else only:
        item = items[i]
        rows, starts = tokenize(task, render(task, item, fewshot(items, i, task.num_fewshot)), enc)
        rows, starts = crop(rows, starts, max_len, f"CORE bundle {bundle}, task {task.label}, item {i}")
        out.append(Example(rows, starts, item.get("gold") if task.kind != "language_modeling" else None))
    return out
