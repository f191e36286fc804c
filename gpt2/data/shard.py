"""Data step 3, shard: cut the token stream into llm.c shards on local disk.

The validation split comes first (fixed, so the validation set never depends
on the GPU count), then train; the step's record (`shards.json`) is written
last. The val split is the stream's first data.val_tokens tokens, the tokens
the source fixes as val (nanoGPT's val.bin), or with data.val_split=nanogpt the
documents nanoGPT holds out (gpt2.data.doc_split).
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Iterator

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpt2.config.tree import Config
from gpt2.data.doc_split import split_documents
from gpt2.data.llmc import write_shard
from gpt2.data.manifest import ShardEntry
from gpt2.data.step_record import reuse
from gpt2.data.tokenize import EmptyCorpusError
from gpt2.data.tokenized import Tokenized
from gpt2.root import layout, storage

log = logging.getLogger(__name__)

DONE_RECORD = "shards.json"


class LocalShards(BaseModel):
    model_config = ConfigDict(frozen=True)
    directory: str
    shards: list[ShardEntry]
    documents: int


def local_shards_ok(local: LocalShards) -> bool:
    """A cached result is good while every shard is there at its size."""
    d = Path(local.directory)
    return all((d / e.path).is_file() and (d / e.path).stat().st_size == e.bytes for e in local.shards)


def split_sizes(config: Config, total: int, val: int | None = None) -> list[tuple[str, int]]:
    """(split, tokens) of every shard: the val slice first, then train.

    `val`: the val split's tokens where the source or data.val_split fixes
    them; otherwise the val slice is `data.val_tokens` unless the corpus is
    smaller than twice that; then it is a tenth of the corpus, so small corpora
    still get both.
    """
    if val is None:
        val = config.data.val_tokens
        if total < 2 * val:
            val = max(1, total // 10)
            log.warning("corpus has %d tokens, fewer than 2 × data.val_tokens; using %d for validation", total, val)
    if total - val < 1:
        raise EmptyCorpusError(f"corpus has only {total} tokens: too few for a validation and a training split")
    size = config.data.shard_size
    plan = []
    for split, n in (("val", val), ("train", total - val)):
        plan += [(split, min(size, n - start)) for start in range(0, n, size)]
    return plan


def _split_stream(config: Config, tok: Tokenized) -> tuple[Iterator[np.ndarray], int | None]:
    """The token stream with the val split's tokens first, and their number
    (None: split_sizes cuts the head of the stream by data.val_tokens)."""
    if config.data.val_split == "nanogpt" and tok.val_tokens is None:
        val, n_val, train = split_documents([Path(tok.directory) / name for name in tok.parts], tok.documents)
        return itertools.chain(val, train), n_val
    return _read_stream(tok), tok.val_tokens


def _read_stream(tok: Tokenized) -> Iterator[np.ndarray]:
    for name in tok.parts:
        path = Path(tok.directory) / name
        if path.stat().st_size:  # mapped, not read: shards are written from views of the parts
            yield np.memmap(path, dtype=np.uint16, mode="r")


def shard_tokens(config: Config, tok: Tokenized) -> LocalShards:
    """Cut the token stream into llm.c shards in the local work directory."""
    directory = layout.data_step_dir(config, "shard")
    directory.mkdir(parents=True, exist_ok=True)
    done_file = directory / DONE_RECORD
    if done := reuse(done_file, LocalShards, local_shards_ok):
        return done
    (stream, n_val), rest = _split_stream(config, tok), []
    entries = []
    for index, (split, n) in enumerate(split_sizes(config, tok.tokens, n_val)):
        # Views into the mapped parts, never a concatenated copy (which, with
        # shards smaller than a part, also recopied the part's rest per shard).
        pieces, have = rest, sum(len(p) for p in rest)
        while have < n:
            pieces.append(next(stream))
            have += len(pieces[-1])
        cut = len(pieces[-1]) - (have - n)
        pieces, rest = pieces[:-1] + [pieces[-1][:cut]], [pieces[-1][cut:]] if have > n else []
        name = f"{config.data.name}_{split}_{index:06d}.bin"
        tmp = directory / f".{name}.tmp"
        with open(tmp, "wb") as f:
            sha = write_shard(f, pieces, name)
        storage.replace_durably(tmp, directory / name)
        size = (directory / name).stat().st_size
        entries.append(ShardEntry(path=name, split=split, tokens=n, bytes=size, sha256=sha))
    result = LocalShards(directory=str(directory), shards=entries, documents=tok.documents)
    storage.write_record(str(done_file), result.model_dump(mode="json"))
    return result
