"""The `data` section of the config tree (gpt2.config.tree): what the data stage
prepares, and the order training reads it in; and the built-in sources it can
name (`builtin:python-docs`), whose content is part of the data's identity
(gpt2.config.identity), so they live here, below every stage that reads them."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import Field, model_validator

from gpt2.config.sections import Section
from gpt2.errors import UserError

BUILTIN_PREFIX = "builtin:"
BUILTIN_SOURCES = ("builtin:python-docs",)


class SourceError(UserError, ValueError):
    """The source cannot be read; the message names it and says what to do."""


def builtin_documents(name: str) -> list[dict]:
    """The documents of a built-in source, in a fixed order."""
    if name != "builtin:python-docs":
        raise SourceError(f"unknown built-in source {name!r}; available: {', '.join(BUILTIN_SOURCES)}")
    from pydoc_data.topics import topics

    return [{"id": key, "text": topics[key]} for key in sorted(topics)]


def builtin_digest(name: str) -> str:
    """Content hash of a built-in source: its text differs between Python
    versions, so it is part of the data identity."""
    blob = json.dumps(builtin_documents(name), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class DataConfig(Section):
    name: str = Field("fineweb_edu_10B", pattern=r"^[A-Za-z0-9_.-]+$")
    """Readable name of the dataset; prefixes shard names and the data directory."""
    source: str = "hf://datasets/HuggingFaceFW/fineweb-edu/sample/10BT/*.parquet"
    """Where documents come from: an fsspec URL or glob of .jsonl/.json/.parquet/.txt
    files (file://, gs://, s3://, hf://datasets/...), or `builtin:python-docs`, the
    offline sample of English prose shipped with Python."""
    text_field: str = "text"
    """Column or JSON key holding each document's text (ignored for .txt files)."""
    max_documents: int | None = Field(None, ge=1)
    """Stop after this many documents (trial runs); None reads everything."""
    max_tokens: int | None = Field(None, ge=1)
    """Stop once this many tokens are written (trial runs); None reads everything."""
    max_document_chars: int = Field(1_000_000, ge=1)
    """Documents longer than this many characters are truncated to it (and counted in
    the tokenize step's log): bounds one document's tokenizer time and memory."""
    shard_size: int = Field(100_000_000, ge=1024, le=2**31 - 1)
    """Tokens per shard file (llm.c uses 1e8)."""
    val_tokens: int = Field(100_000_000, ge=1)
    """Size of the fixed validation slice, taken first from the token stream."""
    tokenizer: Literal["gpt2"] = "gpt2"
    """Tokenizer encoding (tiktoken name)."""
    source_format: Literal["auto", "nanogpt-bin"] = "auto"
    """How data.source is read. `auto`: text documents, the format from the file names
    (.jsonl/.json/.parquet/.txt), tokenized here. `nanogpt-bin`: nanoGPT's token files
    (a folder or glob holding `train.bin` and `val.bin`: raw uint16 GPT-2 ids, no header),
    turned into shards as they are, never retokenized; the split is the files' (val.bin is
    the validation split), so data.val_tokens and data.val_split do not apply."""
    val_split: Literal["head", "nanogpt"] = "head"
    """Which documents are the validation split. `head`: the first data.val_tokens tokens
    of the stream (llm.c's fixed slice). `nanogpt`: the documents nanoGPT's OpenWebText
    prepare.py holds out, `datasets`' train_test_split(test_size=0.0005, seed=2357,
    shuffle=True) over the source's documents in order, val in that split's order, train
    in the source's (gpt2.data.doc_split)."""
    shuffle: bool = False
    """Train on the shards in a seeded order (train.seed) instead of llm.c's fixed one:
    each epoch a permutation of the train shards and of the sequences within each
    shard (gpt2.data.order). Part of the run's identity, not of the data's: the same
    shards serve both orders. Off: the reference order, and today's runs unchanged."""

    @model_validator(mode="after")
    def _token_files_are_used_whole(self) -> "DataConfig":
        if self.source_format == "nanogpt-bin":
            limits = [k for k in ("max_documents", "max_tokens") if getattr(self, k) is not None]
            if limits:
                keys = f"data.{' and data.'.join(limits)} {'do' if len(limits) > 1 else 'does'}"
                raise ValueError(f"{keys} not apply to data.source_format=nanogpt-bin: its files are used whole; "
                                 "to train on fewer tokens set train.max_steps")
            if self.source.startswith("builtin:"):
                raise ValueError(f"data.source {self.source!r} is text, not nanoGPT's token files: give the folder "
                                 "or glob holding train.bin and val.bin, or data.source_format=auto")
        return self
