"""CORE's decisions, several items per forward pass.

The reference algorithm (DCLM's, nanochat's `core_eval.py`) runs one item per forward pass:
multiple choice and schema pick the option whose continuation has the lowest mean loss (the
first on ties), language modelling is right when the greedy argmax reproduces every
continuation token. Here `batch_size` items share a pass: a multiple-choice item's options go
in ONE packed row (their shared prefix once, each continuation after it, masked from the
others: gpt2.eval.packed), other items as one row per option, right-padded (causal, so padding
never reaches a scored position). A test scores the same items both ways and gets the same
picks on every item.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from gpt2.eval.core.prompts import Example
from gpt2.eval.logprobs import ContinuationScore, eval_mode, score_batch
from gpt2.eval.packed import pack, score_packed
from gpt2.model import GPT


@dataclass(frozen=True)
class Decision:
    correct: bool
    pred: int | None
    """The option picked (None for language modelling)."""


def decide(example: Example, scores: Sequence[ContinuationScore]) -> Decision:
    if example.gold is None:
        return Decision(scores[0].greedy, None)
    # Mean loss per continuation token; an empty continuation has none (nan), as in the reference.
    means = [-s.logprob / s.n_tokens if s.n_tokens else math.nan for s in scores]
    pred = means.index(min(means))
    return Decision(pred == example.gold, pred)


def packable(model: nn.Module, example: Example) -> bool:
    """A multiple-choice item whose rows share their prefix up to one start (none was cropped)."""
    starts = set(example.starts)
    if not isinstance(getattr(model, "_orig_mod", model), GPT) or example.gold is None or len(starts) != 1:
        return False
    start = example.starts[0]
    return all(r[:start] == example.rows[0][:start] for r in example.rows)


def _score_chunk(model: nn.Module, chunk: list[Example], device: torch.device) -> list[list[ContinuationScore]]:
    out: list[list[ContinuationScore] | None] = [None] * len(chunk)
    packed = [i for i, ex in enumerate(chunk) if packable(model, ex)]
    if packed:
        batch = [pack(list(chunk[i].rows[0][:chunk[i].starts[0]]), [list(r[chunk[i].starts[0]:]) for r in chunk[i].rows])
                 for i in packed]
        for i, scores in zip(packed, score_packed(model, batch, device)):
            out[i] = [ContinuationScore(*s) for s in scores]
    rest = [i for i in range(len(chunk)) if out[i] is None]
    if rest:
        # The last token of a row is only a target; the continuation runs to the row's end.
        rows = [(list(r[:-1]), list(r[s:])) for i in rest for r, s in zip(chunk[i].rows, chunk[i].starts)]
        flat, at = score_batch(model, rows, device), 0
        for i in rest:
            out[i] = flat[at: at + len(chunk[i].rows)]
            at += len(chunk[i].rows)
    return out  # type: ignore[return-value]


def score_examples(model: nn.Module, examples: Sequence[Example], device: torch.device | str,
                   batch_size: int = 8) -> list[Decision]:
    """The decision on every example, in order; `batch_size` examples per forward pass, the
    longest first so a pass holds rows of similar length."""
    device = torch.device(device)
    order = sorted(range(len(examples)), key=lambda i: -max(map(len, examples[i].rows)))
    out: list[Decision | None] = [None] * len(examples)
    with eval_mode(model):
        for at in range(0, len(order), batch_size):
            chunk = order[at: at + batch_size]
            for i, scores in zip(chunk, _score_chunk(model, [examples[i] for i in chunk], device)):
                out[i] = decide(examples[i], scores)
    return out  # type: ignore[return-value]


def timed(model: nn.Module, examples: Sequence[Example], device: torch.device | str,
          batch_size: int = 8) -> tuple[list[Decision], float]:
    """The decisions and the items scored per second."""
    t0 = time.perf_counter()
    decisions = score_examples(model, examples, device, batch_size)
    return decisions, len(examples) / max(time.perf_counter() - t0, 1e-9)
