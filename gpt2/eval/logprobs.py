"""Log-probabilities of continuations under our GPT, many sequences per forward.

Shared by the native HellaSwag and CORE scorers and the lm-eval wrapper, and written to
give what lm-eval's Hugging Face backend gives: left truncation to the
context length, right padding, log-softmax over GPT-2's 50,257 real tokens
(the padded embedding rows are not part of the distribution).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import tiktoken
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2.model import GPT
from gpt2.tokenizer import N_VOCAB


def encode(enc: tiktoken.Encoding, text: str) -> list[int]:
    """The ids every scorer here scores `text` as. Special tokens written in the text become
    special ids, as the Hugging Face tokenizer does, so both lm-eval backends see the same ids."""
    return enc.encode(text, allowed_special="all")


@dataclass(frozen=True)
class ContinuationScore:
    logprob: float
    """Summed log-probability of the continuation tokens."""
    n_tokens: int
    """Continuation tokens scored."""
    greedy: bool
    """Whether every continuation token is the model's argmax."""


def model_inputs(context: Sequence[int], continuation: Sequence[int], max_len: int) -> tuple[list[int], int]:
    """Input ids and continuation length, truncated from the left like lm-eval:
    the last max_len + 1 tokens, minus the final one (it is only a target)."""
    if not continuation:
        raise ValueError("empty continuation")
    if len(continuation) > max_len:
        raise ValueError(f"continuation of {len(continuation)} tokens exceeds the context length {max_len}")
    seq = (list(context) + list(continuation))[-(max_len + 1):]
    return seq[:-1], len(continuation)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Evaluate without gradients, restoring train mode after (the training loop
    calls the scorer in the middle of a run)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _hidden_states(model: nn.Module, idx: torch.Tensor) -> torch.Tensor | None:
    """Final hidden states (R, L, C) of our GPT, or None for another model.

    Mirrors GPT.forward up to ln_f so the output head runs only on the few
    positions that are scored: on HellaSwag that skips ~80% of the head's
    50,304-wide matmul. A test checks it against GPT.forward."""
    core = getattr(model, "_orig_mod", model)
    if not isinstance(core, GPT):
        return None
    tr = core.transformer
    x = tr.wte(idx) + tr.wpe(torch.arange(idx.size(1), device=idx.device))  # (R, L, C)
    for block in tr.h:
        x = block(x)
    return tr.ln_f(x)


def selected_logits(model: nn.Module, idx: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Logits over the real vocabulary at (rows[i], positions[i]): (N, 50257), fp32."""
    hidden = _hidden_states(model, idx)
    if hidden is None:
        out = model(idx)
        logits = (out[0] if isinstance(out, tuple) else out)[rows, positions]  # (N, V)
    else:
        logits = getattr(model, "_orig_mod", model).lm_head(hidden[rows, positions])  # (N, C) -> (N, V)
    return logits[:, :N_VOCAB].float()


def score_batch(model: nn.Module, rows: list[tuple[list[int], list[int]]], device: torch.device | str) -> list[ContinuationScore]:
    """Score (input ids, continuation ids) rows in one forward pass; inputs are
    already truncated (see `model_inputs`); the model is already in eval mode."""
    width = max(len(inp) for inp, _ in rows)
    idx = torch.zeros((len(rows), width), dtype=torch.long)
    row_of, pos_of, targets = [], [], []
    for r, (inp, cont) in enumerate(rows):
        idx[r, : len(inp)] = torch.tensor(inp)  # right padding: causal, so it never leaks back
        # Positions inplen-contlen .. inplen-1 predict the continuation tokens.
        row_of += [r] * len(cont)
        pos_of += range(len(inp) - len(cont), len(inp))
        targets += cont
    device = torch.device(device)
    as_index = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
    logits = selected_logits(model, idx.to(device), as_index(row_of), as_index(pos_of))  # (N, V)
    target = as_index(targets)
    picked = F.log_softmax(logits, dim=-1).gather(1, target[:, None]).squeeze(1).cpu()  # (N,)
    hits = (logits.argmax(dim=-1) == target).cpu()  # (N,)
    scores, start = [], 0
    for _, cont in rows:
        end = start + len(cont)
        scores.append(ContinuationScore(float(picked[start:end].sum()), len(cont), bool(hits[start:end].all())))
        start = end
    return scores


def score_requests(
    model: nn.Module,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    device: torch.device | str,
    batch_rows: int,
    max_len: int,
) -> list[ContinuationScore]:
    """Score (context ids, continuation ids) pairs, `batch_rows` sequences per
    forward, longest first so a batch holds sequences of similar length."""
    prepared = [model_inputs(ctx, cont, max_len) for ctx, cont in requests]
    rows = [(inp, list(cont)[-n:]) for (inp, n), (_, cont) in zip(prepared, requests)]
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    out: list[ContinuationScore | None] = [None] * len(rows)
    with eval_mode(model):
        for start in range(0, len(order), batch_rows):
            chunk = order[start: start + batch_rows]
            for i, score in zip(chunk, score_batch(model, [rows[i] for i in chunk], device)):
                out[i] = score
    return out  # type: ignore[return-value]
