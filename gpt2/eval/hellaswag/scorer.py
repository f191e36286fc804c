"""Native batched HellaSwag scorer: lm-eval's numbers, fast enough for the
training loop.

All four endings of an item go through the model in the same forward pass
(packed into one sequence that holds the shared context once), several items
per pass. The prompt, tokenization and metrics are lm-eval's
`hellaswag` task:

- acc: the ending with the highest summed log-probability,
- acc_norm: summed log-probability divided by the ending's length in
  characters (lm-eval's definition; what published lm-eval tables quote),
- acc_norm_per_token: mean log-probability per ending token (the llm.c /
  build-nanogpt variant, here on lm-eval's prompt), reported under its own name.

In the training loop (pass the unwrapped model; wrap the call in autocast to
score in bf16):

    items = prepare(load_items(config.eval.hellaswag_source, config.eval.limit))  # tokenized once
    metrics = evaluate_hellaswag(model, items, device, config.eval.batch_size)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import tiktoken
import torch
import torch.nn as nn

from gpt2.eval.hellaswag.items import Item
from gpt2.eval.logprobs import ContinuationScore, encode, eval_mode, model_inputs, score_batch
from gpt2.eval.packed import fits, pack, score_packed
from gpt2.model import GPT
from gpt2.tokenizer import get_encoding


def encode_pair(enc: tiktoken.Encoding, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM._encode_pair for a causal model: trailing spaces of
    the context move to the continuation; the whole string is encoded and split
    after the context's tokens (so a merge across the boundary is kept)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = encode(enc, context + continuation)
    context_ids = encode(enc, context)
    return context_ids, whole[len(context_ids):]


def item_requests(enc: tiktoken.Encoding, item: Item) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) for each ending; lm-eval scores
    `query` followed by " " + ending."""
    return [encode_pair(enc, item.query, " " + ending) for ending in item.endings]


@dataclass(frozen=True)
class ItemScore:
    scores: tuple[ContinuationScore, ...]
    label: int
    pred: int
    """argmax of summed log-probability (acc)."""
    pred_norm: int
    """argmax of log-probability per character of the ending (acc_norm)."""
    pred_norm_per_token: int
    """argmax of mean log-probability per token (acc_norm_per_token)."""


def judge(item: Item, scores: Sequence[ContinuationScore]) -> ItemScore:
    # numpy float64 and argmax (first maximum on ties) exactly as lm-eval.
    lls = np.array([s.logprob for s in scores])
    chars = np.array([float(len(e)) for e in item.endings])
    tokens = np.array([float(s.n_tokens) for s in scores])
    return ItemScore(
        scores=tuple(scores),
        label=item.label,
        pred=int(np.argmax(lls)),
        pred_norm=int(np.argmax(lls / chars)),
        pred_norm_per_token=int(np.argmax(lls / tokens)),
    )


@dataclass(frozen=True)
class Prepared:
    """Items with their ending requests tokenized, in scoring order: the
    training loop prepares the 10,042 items once and scores them at every
    evaluation, instead of tokenizing 40k requests each time."""

    items: tuple[Item, ...]
    requests: tuple[list[tuple[list[int], list[int]]], ...]
    order: tuple[int, ...]
    """Longest items first: items of similar length share a batch, less padding."""

    def __len__(self) -> int:
        return len(self.items)

    def subset(self, indices: Sequence[int]) -> "Prepared":
        """The items at `indices` (e.g. one rank's share), still tokenized."""
        keep = list(indices)
        items, reqs = tuple(self.items[i] for i in keep), tuple(self.requests[i] for i in keep)
        return Prepared(items, reqs, _longest_first(reqs))


def _longest_first(reqs: Sequence[list[tuple[list[int], list[int]]]]) -> tuple[int, ...]:
    return tuple(sorted(range(len(reqs)), key=lambda i: -sum(len(c) + len(k) for c, k in reqs[i])))


def prepare(items: Sequence[Item] | Prepared) -> Prepared:
    if isinstance(items, Prepared):
        return items
    enc = get_encoding("gpt2")
    reqs = tuple(item_requests(enc, item) for item in items)
    return Prepared(tuple(items), reqs, _longest_first(reqs))


def score_items(model: nn.Module, items: Sequence[Item] | Prepared, device: torch.device | str,
                batch_size: int = 8) -> list[ItemScore]:
    """Per-item scores, `batch_size` items per forward pass. Our GPT scores the
    four endings of an item in one packed sequence (`gpt2.eval.packed`);
    another model, or an item longer than the window, as four rows."""
    prepared, device = prepare(items), torch.device(device)
    items, reqs, order = prepared.items, prepared.requests, prepared.order
    max_len = model.config.block_size
    packable = isinstance(getattr(model, "_orig_mod", model), GPT)
    out: list[ItemScore | None] = [None] * len(items)
    with eval_mode(model):
        for start in range(0, len(order), batch_size):
            chunk = order[start: start + batch_size]
            packed = [i for i in chunk if packable and fits(reqs[i][0][0], [k for _, k in reqs[i]], max_len)]
            if packed:
                batch = [pack(reqs[i][0][0], [k for _, k in reqs[i]]) for i in packed]
                for i, scores in zip(packed, score_packed(model, batch, device)):
                    out[i] = judge(items[i], [ContinuationScore(*s) for s in scores])
            rest = [i for i in chunk if i not in packed]
            if rest:
                flat = [(model_inputs(c, k, max_len)[0], k) for i in rest for c, k in reqs[i]]  # (items × endings) rows
                scores = score_batch(model, flat, device)
                for n, i in enumerate(rest):
                    m = len(items[i].endings)
                    out[i] = judge(items[i], scores[n * m: (n + 1) * m])
    return out  # type: ignore[return-value]


def summarize(scored: Sequence[ItemScore]) -> dict[str, float]:
    n = len(scored)
    return {
        "acc": sum(s.pred == s.label for s in scored) / n,
        "acc_norm": sum(s.pred_norm == s.label for s in scored) / n,
        "acc_norm_per_token": sum(s.pred_norm_per_token == s.label for s in scored) / n,
        "n": n,
    }


def evaluate_hellaswag(model: nn.Module, items: Sequence[Item] | Prepared, device: torch.device | str,
                       batch_size: int = 8) -> dict[str, float]:
    """HellaSwag metrics of `model` on `items` (or items prepared once with
    `prepare`): acc, acc_norm, acc_norm_per_token, n, plus the scorer's
    throughput (items_per_s)."""
    if not items:
        raise ValueError("no HellaSwag items to score")
    t0 = time.perf_counter()
    metrics = summarize(score_items(model, items, device, batch_size))
    metrics["items_per_s"] = len(items) / max(time.perf_counter() - t0, 1e-9)
    return metrics
