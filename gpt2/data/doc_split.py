"""data.val_split=nanogpt: the validation documents nanoGPT holds out.

nanoGPT's data/openwebtext/prepare.py splits OpenWebText with `datasets`'
`train_test_split(test_size=0.0005, seed=2357, shuffle=True)`: a permutation of
the N documents by `np.random.default_rng(2357)`, its first ceil(0.0005·N)
entries the val split (in that order), every other document train. The same
permutation over the same documents in the same order picks the same val
documents here, so a val loss measured on them is nanoGPT's measurement.

The token stream (each document preceded by <|endoftext|>, as llm.c writes it)
is split without a copy of the train documents: one pass finds the documents'
starts in each part, the val documents (~4.4M tokens for OpenWebText) are
gathered in memory, and train is yielded as views of the parts around them,
in source order (llm.c's recipe: its shards keep the source's order).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from gpt2.data.llmc import ShardError
from gpt2.tokenizer import EOT_TOKEN

NANOGPT_TEST_SIZE = 0.0005
NANOGPT_SEED = 2357


def nanogpt_val_documents(n_documents: int) -> np.ndarray:
    """Indices of the val documents among `n_documents`, in the val split's order."""
    n_test = math.ceil(NANOGPT_TEST_SIZE * n_documents)
    return np.random.default_rng(NANOGPT_SEED).permutation(n_documents)[:n_test]


def split_documents(parts: Sequence[Path], n_documents: int) -> tuple[list[np.ndarray], int, Iterator[np.ndarray]]:
    """(val documents in the val split's order, their tokens, the train stream).
    `parts`: the uint16 token parts in stream order, each starting with a
    document's <|endoftext|> (units never split a document)."""
    val_index = nanogpt_val_documents(n_documents)
    wanted = {int(d): k for k, d in enumerate(val_index)}
    val: list[np.ndarray | None] = [None] * len(val_index)
    held: list[tuple[Path, list[tuple[int, int]]]] = []  # each part and its val documents' spans
    first = 0
    for path in parts:
        tokens = _mapped(path)
        if len(tokens) == 0:
            continue
        starts = np.flatnonzero(tokens == EOT_TOKEN)
        if len(starts) == 0 or starts[0] != 0:
            raise ShardError(f"token part {path} does not start with <|endoftext|>: its documents cannot be told "
                             "apart; delete the data stage's work directory and rerun `gpt2 prepare`")
        ends = np.append(starts[1:], len(tokens))
        spans = []
        for d in range(first, first + len(starts)):
            if d in wanted:
                a, b = int(starts[d - first]), int(ends[d - first])
                val[wanted[d]] = np.array(tokens[a:b])
                spans.append((a, b))
        held.append((path, spans))
        first += len(starts)
    if first != n_documents:
        raise ShardError(f"the token parts hold {first} documents, their record says {n_documents}; delete the "
                         "data stage's work directory and rerun `gpt2 prepare`")
    gathered = [v for v in val if v is not None]
    return gathered, sum(len(v) for v in gathered), _around(held)


def _mapped(path: Path) -> np.ndarray:
    # Mapped when read, not held open: a corpus may have a thousand parts.
    return np.memmap(path, dtype=np.uint16, mode="r") if path.stat().st_size else np.zeros(0, np.uint16)


def _around(held: list[tuple[Path, list[tuple[int, int]]]]) -> Iterator[np.ndarray]:
    """Each part's tokens outside its val spans, as views."""
    for path, spans in held:
        tokens, at = _mapped(path), 0
        for a, b in spans:
            if a > at:
                yield tokens[at:a]
            at = b
        if at < len(tokens):
            yield tokens[at:]
