"""A work unit of the data stage and what running one gives: the contract
between the tokenize step's coordinator (gpt2.data.tokenize), the code that
plans and runs units (gpt2.data.units), their readers (gpt2.data.unit_readers)
and the executors that run them somewhere (UnitExecutor: this machine's
process pool, gpt2.data.unit_pool, or a cluster, tasks/data_cluster.py).
Besides the names agreed for executors, UnitResult carries `first_cut`, for
the coordinator's truncation warning.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator
from typing import Protocol

from pydantic import BaseModel, ConfigDict


class Unit(BaseModel):
    """One piece of the source. parquet: row groups [start, stop); jsonl:
    bytes [start, stop); json and text: the whole file (start 0, stop its size)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    index: int
    url: str
    format: str  # jsonl, parquet, json or text
    start: int
    stop: int

    @property
    def name(self) -> str:
        return f"part_{self.index:06d}.bin"

    @property
    def record(self) -> str:
        return f"part_{self.index:06d}.json"

    def __str__(self) -> str:
        what = {"jsonl": "bytes", "parquet": "row groups"}.get(self.format)
        span = f" {what} {self.start}-{self.stop}" if what else ""
        return f"unit {self.index} ({posixpath.basename(self.url)}{span})"


class UnitResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    index: int
    documents: int
    tokens: int
    truncated: int
    """Documents cut to data.max_document_chars."""
    name: str
    """The part file, relative to the executor's directory."""
    sha256: str
    first_cut: tuple[int, int] | None = None
    """(document within the unit, its characters) of the first truncated document."""


class UnitExecutor(Protocol):
    directory: str
    """Where units write: a local path, or an fsspec URL every worker can reach."""

    def map(self, units: Iterable[Unit]) -> Iterator[UnitResult]:
        """Results in any completion order; pulls units lazily, so the
        coordinator can stop handing them out once the limits are met."""
        ...
