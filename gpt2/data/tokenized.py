"""The tokenize step's result: the token stream as part files on local disk,
and its record (`done.json`, written last). Both readers write it, text
sources tokenized by work units (gpt2.data.tokenize) and nanoGPT's token files
read as they are (gpt2.data.nanogpt_bin); the download, shard and flow steps
read it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gpt2.config.tree import Config
from gpt2.data.step_record import reuse
from gpt2.root import layout

DONE_RECORD = "done.json"


class Tokenized(BaseModel):
    model_config = ConfigDict(frozen=True)
    directory: str
    documents: int
    tokens: int
    parts: list[str]
    """Part files, in stream order: names in `directory`, or absolute paths of
    token files read where they lie (nanoGPT's, gpt2.data.nanogpt_bin)."""
    truncated: int = 0
    """Documents cut to data.max_document_chars (0 in records older than the key)."""
    val_tokens: int | None = None
    """Tokens at the head of the stream that the source fixes as the val split
    (nanoGPT's val.bin); None: the shard step splits (gpt2.data.shard.split_sizes)."""


def tokenized_ok(tok: Tokenized) -> bool:
    """A cached result is good while its part files are still there."""
    return all((Path(tok.directory) / name).is_file() for name in tok.parts)


def tokens_done(config: Config) -> bool:
    """Whether the tokenize step's record is there and its parts are whole."""
    return reuse(layout.data_step_dir(config, "tokenize") / DONE_RECORD, Tokenized, tokenized_ok) is not None
