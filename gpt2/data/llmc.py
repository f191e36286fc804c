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

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")


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


def write_shard(f: BinaryIO, tokens: np.ndarray | Sequence[np.ndarray]) -> str:
    """Write header + tokens to an open binary file; returns the sha256 of the bytes.

    `tokens` may be a list of arrays (views into larger ones) written back to
    back, so a shard spanning several inputs is never concatenated in memory.
    """
    pieces = [tokens] if isinstance(tokens, np.ndarray) else list(tokens)
    pieces = [np.ascontiguousarray(p, dtype=TOKEN_DTYPE) for p in pieces]
    digest = hashlib.sha256()
    for chunk in [make_header(sum(len(p) for p in pieces)), *(memoryview(p).cast("B") for p in pieces)]:
        f.write(chunk)
        digest.update(chunk)
    return digest.hexdigest()


def read_shard(path: str | Path) -> np.ndarray:
    """Memory-map a local shard's tokens after checking its header and size."""
    path = Path(path)
    with open(path, "rb") as f:
        n = parse_header(f.read(HEADER_BYTES), str(path))
    size = path.stat().st_size
    if size != shard_nbytes(n):
        raise ShardError(
            f"shard {path}: header says {n} tokens ({shard_nbytes(n)} bytes) but the file has {size} bytes; "
            "it is truncated or corrupt: delete it and rerun `gpt2 prepare`"
        )
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(n,))
