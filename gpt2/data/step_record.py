"""A local data step's completion record, read back: the step's result if its
record parses and the files it names are all still there (the tokenize step's
`done.json`, gpt2.data.tokenized; the shard step's `shards.json`, gpt2.data.shard).
A record that fails either is removed, so the step is redone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ValidationError

from gpt2.root import storage


def reuse(record_path: Path, model: type[BaseModel], ok: Callable[[BaseModel], bool]) -> BaseModel | None:
    """A local step's completion record, if it parses and its files are all
    still there; otherwise the record goes and the step is redone."""
    record = storage.read_record(str(record_path))
    if record is not None:
        try:
            done = model.model_validate(record)
        except ValidationError:
            done = None
        if done is not None and ok(done):
            return done
    record_path.unlink(missing_ok=True)
    return None
