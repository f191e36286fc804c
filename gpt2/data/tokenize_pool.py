"""Parallel, order-preserving, bounded-memory tokenization.

The parent streams batches of documents; worker processes encode a whole batch
each and send back one uint16 buffer with `<|endoftext|>` before every
document. Compared with llm.c's `fineweb.py` (one pool task per document and
one numpy conversion per document), batching cuts the pickling and
scheduling cost per document by two orders of magnitude. Processes rather than
threads: tiktoken holds the GIL for part of each call, so threads stop scaling
(measured in bench/tokenize.py). At most `window` batches are in flight, so
memory is bounded whatever the corpus size, and results come back in input
order, so the token stream is the same for any number of workers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from typing import Iterable, Iterator

import numpy as np

from gpt2.tokenizer import EOT_TOKEN, get_encoding

_ENCODING = None


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def encode_batch(texts: list[str]) -> np.ndarray:
    """[EOT, doc0..., EOT, doc1..., ...] as uint16 for a batch of documents."""
    global _ENCODING
    if _ENCODING is None:
        _ENCODING = get_encoding("gpt2")
    # encode_to_numpy with no special tokens allowed or disallowed is
    # encode_ordinary without the list round-trip: "<|endoftext|>" inside a
    # document is encoded as plain text, never as the separator.
    pieces = []
    eot = np.array([EOT_TOKEN], dtype=np.uint32)
    for text in texts:
        pieces.append(eot)
        pieces.append(_ENCODING.encode_to_numpy(text, disallowed_special=()))
    if not pieces:
        return np.empty(0, dtype=np.uint16)
    # GPT-2 ids are < 2**16, so the narrowing cast is exact.
    return np.concatenate(pieces).astype(np.uint16)


def _warm_up() -> None:
    encode_batch(["warm up"])


def tokenize_stream(
    batches: Iterable[list[str]], num_workers: int = 0, window: int | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (documents in batch, tokens) for every batch, in input order.

    num_workers=0 uses every core; 1 encodes in this process.
    """
    workers = num_workers or default_workers()
    if workers == 1:
        for texts in batches:
            yield len(texts), encode_batch(texts)
        return
    window = window or 4 * workers
    # spawn, not fork: the parent may hold threads (datasets, Prefect) that a
    # forked child would inherit in a locked state.
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, initializer=_warm_up) as pool:
        pending: deque = deque()
        for texts in batches:
            pending.append((len(texts), pool.apply_async(encode_batch, (texts,))))
            if len(pending) >= window:
                n, res = pending.popleft()
                yield n, res.get()
        while pending:
            n, res = pending.popleft()
            yield n, res.get()
