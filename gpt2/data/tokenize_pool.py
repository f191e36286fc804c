"""Parallel, order-preserving, bounded-memory tokenization of batches of texts.

The parent streams batches of documents; worker processes encode a whole batch
each and send back one uint16 buffer with `<|endoftext|>` before every
document. Compared with llm.c's `fineweb.py` (one pool task per document and
one numpy conversion per document), batching cuts the pickling and
scheduling cost per document by two orders of magnitude. Processes rather than
threads: tiktoken holds the GIL for part of each call, so threads stop scaling
(measured in bench/tokenize.py). At most `window` batches are in flight, so
memory is bounded whatever the corpus size, and results come back in input
order, so the token stream is the same for any number of workers.

The processes are gpt2.data.process_pool's: a worker that dies is an error
naming it, its exit signal and its documents, never a hang. The data stage
itself tokenizes work units (gpt2.data.units), each encoded by encode_batch.

Long runs without whitespace (base64 blobs, "aaaa...") are encoded whole:
tiktoken >= 0.13 merges them in near-linear time (0.4 s for a million-letter
run, where 0.12 takes minutes), so cutting them, which would change their
tokens, buys nothing; data.max_document_chars bounds a document's time and
memory instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from gpt2.data.process_pool import TokenizeWorkerError, default_workers, run_pool
from gpt2.tokenizer import EOT_TOKEN, get_encoding

__all__ = ["TokenizeWorkerError", "default_workers", "encode_batch", "tokenize_stream"]

_ENCODING = None


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


def warm_up() -> None:
    """Load the encoding (a worker does it before its first job)."""
    encode_batch(["warm up"])


def tokenize_stream(
    batches: Iterable[list[str]], num_workers: int = 0, window: int | None = None, first_document: int = 0
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (documents in batch, tokens) for every batch, in input order.

    num_workers=0 uses every core; 1 encodes in this process. first_document:
    the index of the first document in the source, to name documents in errors.
    """
    workers = num_workers or default_workers()
    if workers == 1:
        for texts in batches:
            yield len(texts), encode_batch(texts)
        return
    def jobs() -> Iterator[tuple[_Batch, list[str]]]:
        first = first_document
        for index, texts in enumerate(batches):
            yield _Batch(index, first, len(texts)), texts
            first += len(texts)

    for batch, tokens in run_pool(encode_batch, jobs(), workers, window or 4 * workers, warm_up):
        yield batch.documents, tokens




@dataclass(frozen=True)
class _Batch:
    index: int
    first_document: int
    documents: int

    def __str__(self) -> str:
        last = self.first_document + self.documents - 1
        return f"documents {self.first_document}-{last} (batch {self.index})"

