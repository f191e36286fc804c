"""llm.c's token shard format.

A shard is a 1024-byte header of 256 little-endian int32 (magic 20240520,
version 1, token count, zeros) followed by the tokens as uint16. Files in
this format load unchanged in llm.c's `dataloader.h` and build-nanogpt.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO, Sequence

import numpy as np

from gpt2.errors import UserError
from gpt2.tokenizer import N_VOCAB

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
# Shards hold GPT-2 ids only (< N_VOCAB). The model's embedding is padded to
# 50304 rows, so ids 50257-50303 would silently train padding rows and larger
# ones crash a CUDA kernel: either way the shard is wrong, so it is refused.


class ShardError(UserError, ValueError):
    """A shard file is malformed; the message names the file."""


def make_header(num_tokens: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, num_tokens
    return header.tobytes()


def shard_nbytes(num_tokens: int) -> int:
    return HEADER_BYTES + num_tokens * TOKEN_DTYPE.itemsize


def parse_header(raw: bytes, name: str) -> int:
    """Check a header and return its token count; `name` is used in errors."""
    if len(raw) < HEADER_BYTES:
        raise ShardError(f"shard {name}: file is {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    if header[0] != MAGIC:
        raise ShardError(f"shard {name}: bad magic {header[0]} (expected {MAGIC}); not an llm.c token shard")
    if header[1] != VERSION:
        raise ShardError(f"shard {name}: unsupported version {header[1]} (expected {VERSION})")
    return int(header[2])


def check_token_ids(tokens: np.ndarray, name: str, start: int = 0) -> None:
    """Refuse ids outside GPT-2's vocabulary, naming the shard and the token
    offset of the first bad one (`start`: offset of `tokens[0]` in the shard)."""
    if len(tokens) == 0 or int(tokens.max()) < N_VOCAB:
        return
    at = int(np.argmax(tokens >= N_VOCAB))
    raise ShardError(
        f"shard {name}: token {start + at} (byte {HEADER_BYTES + 2 * (start + at)}) is id {int(tokens[at])}, "
        f"outside GPT-2's vocabulary (< {N_VOCAB}); the shard was not made by this tokenizer: "
        "delete it and rerun `gpt2 prepare`"
    )


def write_shard(f: BinaryIO, tokens: np.ndarray | Sequence[np.ndarray], name: str = "(new)") -> str:
    """Write header + tokens to an open binary file; returns the sha256 of the bytes.

    `tokens` may be a list of arrays (views into larger ones) written back to
    back, so a shard spanning several inputs is never concatenated in memory.
    Ids outside GPT-2's vocabulary are refused before anything is written.
    """
    pieces = [tokens] if isinstance(tokens, np.ndarray) else list(tokens)
    pieces = [np.ascontiguousarray(p, dtype=TOKEN_DTYPE) for p in pieces]
    start = 0
    for p in pieces:
        check_token_ids(p, name, start)
        start += len(p)
    digest = hashlib.sha256()
    for chunk in [make_header(sum(len(p) for p in pieces)), *(memoryview(p).cast("B") for p in pieces)]:
        f.write(chunk)
        digest.update(chunk)
    return digest.hexdigest()


def read_shard(path: str | Path) -> np.ndarray:
    """Memory-map a local shard's tokens after checking its header, size and ids."""
    path = Path(path)
    with open(path, "rb") as f:
        n = parse_header(f.read(HEADER_BYTES), str(path))
    size = path.stat().st_size
    if size != shard_nbytes(n):
        raise ShardError(
            f"shard {path}: header says {n} tokens ({shard_nbytes(n)} bytes) but the file has {size} bytes; "
            "it is truncated or corrupt: delete it and rerun `gpt2 prepare`"
        )
    tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(n,))
    check_token_ids(tokens, str(path))  # one pass over a mapped file: ~0.1 s per 100M tokens
    return tokens
