"""Data step 2, tokenize: the source's documents into local token parts.

Parts are sealed every `runtime.tokenize_part_tokens` tokens, each with its
record, so a killed run resumes after the last complete part; the step's own
record (`done.json`) is written last. The worker pool that encodes the
documents is gpt2.data.tokenize_pool. Documents longer than
`data.max_document_chars` are truncated to it before they reach a worker, and
counted.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from gpt2 import layout, storage
from gpt2.config import Config
from gpt2.data import sources
from gpt2.data.tokenize_pool import tokenize_stream
from gpt2.errors import UserError

log = logging.getLogger(__name__)

Progress = Callable[[int, int, "int | None"], None]
"""progress(documents_done, tokens_done, documents_total_or_None)."""

DONE_RECORD = "done.json"


class EmptyCorpusError(UserError, ValueError):
    """The source yielded no documents or no tokens."""


class Tokenized(BaseModel):
    model_config = ConfigDict(frozen=True)
    directory: str
    documents: int
    tokens: int
    parts: list[str]
    truncated: int = 0
    """Documents cut to data.max_document_chars (0 in records older than the key)."""


def tokenized_ok(tok: Tokenized) -> bool:
    """A cached result is good while its part files are still there."""
    return all((Path(tok.directory) / name).is_file() for name in tok.parts)


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


def _completed_parts(directory: Path) -> list[dict]:
    parts = []
    for meta in sorted(directory.glob("part_*.json")):
        info = storage.read_record(str(meta))
        data = directory / info["file"] if isinstance(info, dict) and "file" in info else None
        if data is None or not data.is_file() or data.stat().st_size != 2 * info.get("tokens", -1):
            break  # a part whose data no longer matches its record: redo from here
        parts.append(info)
    return parts


class _PartWriter:
    """Appends token arrays to the current part file; seals a part (rename +
    record) every `part_tokens` tokens so a killed run resumes after it."""

    def __init__(self, directory: Path, parts: list[dict], part_tokens: int):
        self.directory, self.parts, self.part_tokens = directory, parts, part_tokens
        self.file, self.docs, self.tokens, self.truncated = None, 0, 0, 0

    @property
    def _tmp(self) -> Path:
        return self.directory / f"part_{len(self.parts):06d}.bin.tmp"

    def write(self, n_docs: int, arr: np.ndarray, truncated: int = 0) -> None:
        if self.file is None:
            self.file = open(self._tmp, "wb")  # noqa: SIM115 - open across writes, closed by seal()/close()
        self.file.write(arr.tobytes())
        self.docs, self.tokens = self.docs + n_docs, self.tokens + len(arr)
        self.truncated += truncated
        if self.tokens >= self.part_tokens:
            self.seal()

    def seal(self) -> None:
        if self.file is None:
            return
        self.file.close()
        self.file = None
        name = f"part_{len(self.parts):06d}"
        storage.replace_durably(self._tmp, self.directory / f"{name}.bin")  # durable before its record
        info = {"file": f"{name}.bin", "documents": self.docs, "tokens": self.tokens, "truncated": self.truncated}
        storage.write_record(str(self.directory / f"{name}.json"), info)
        self.parts.append(info)
        self.docs = self.tokens = self.truncated = 0

    def close(self) -> None:
        if self.file is not None:  # an unsealed part is redone on the next run
            self.file.close()


def _limited(batches: Iterator[list[str]], max_docs: int | None) -> Iterator[list[str]]:
    for texts in batches:
        if max_docs is not None:
            texts = texts[:max_docs]
            max_docs -= len(texts)
        if texts:
            yield texts
        if max_docs == 0:
            return


class _Truncator:
    """Cuts documents to data.max_document_chars: a worker's time and memory
    grow with a document's length (up to ~50 bytes a character on long runs
    without whitespace), so one huge document could stall or kill it."""

    def __init__(self, max_chars: int, first_doc: int):
        self.max_chars, self.doc, self.total = max_chars, first_doc, 0
        # Documents cut in each batch passed on, oldest first: tokenize_stream
        # answers every batch once, in order, so take() pairs with its results.
        self.cut: deque[int] = deque()

    def __call__(self, batches: Iterator[list[str]]) -> Iterator[list[str]]:
        for texts in batches:
            long = [i for i, t in enumerate(texts) if len(t) > self.max_chars]
            if long and not self.total:
                log.warning("document %d has %d characters; keeping its first data.max_document_chars=%d "
                            "(further cuts are counted)", self.doc + long[0], len(texts[long[0]]), self.max_chars)
            if long:
                texts = [t[: self.max_chars] for t in texts]
            self.cut.append(len(long))
            self.total += len(long)
            self.doc += len(texts)
            yield texts

    def take(self) -> int:
        return self.cut.popleft()


SMALL_CORPUS_BYTES = 16 << 20
"""Below this, starting worker processes (~1 s each) costs more than it saves."""


def _workers(config: Config, source: sources.SourceFiles) -> int:
    known = source.sizes and all(source.sizes)
    if known and sum(source.sizes) < SMALL_CORPUS_BYTES:
        return 1  # the token stream is the same for any number of workers
    return config.runtime.num_workers


def tokenize_source(config: Config, source: sources.SourceFiles, progress: Progress | None = None,
                    show_progress: bool = True) -> Tokenized:
    """Tokenize the source into local parts, resuming after the last complete one."""
    directory = layout.data_step_dir(config, "tokenize")
    directory.mkdir(parents=True, exist_ok=True)
    done_file = directory / DONE_RECORD
    if done := reuse(done_file, Tokenized, tokenized_ok):
        return done
    for stray in directory.glob("*.tmp"):
        stray.unlink()
    parts = _completed_parts(directory)
    docs = sum(p["documents"] for p in parts)
    tokens = sum(p["tokens"] for p in parts)
    if parts:
        log.info("resuming tokenization after %d documents (%d tokens) in %d parts", docs, tokens, len(parts))
    max_docs, max_tokens = config.data.max_documents, config.data.max_tokens
    total_docs = min(filter(None, (sources.count_documents(source), max_docs)), default=None)
    truncate = _Truncator(config.data.max_document_chars, docs)
    batches = truncate(_limited(
        sources.iter_text_batches(source, config.data.text_field, skip=docs),
        None if max_docs is None else max_docs - docs,
    ))
    writer = _PartWriter(directory, parts, config.runtime.tokenize_part_tokens)
    bar = _TokenizeBar(show_progress, total_docs, docs, tokens)
    try:
        # A worker's death raises here; the finally below keeps every part
        # sealed so far, and the rerun resumes after them.
        for n_docs, arr in tokenize_stream(batches, _workers(config, source), first_document=docs):
            if max_tokens is not None:
                arr = arr[: max_tokens - tokens]  # exact cut: independent of batching
            writer.write(n_docs, arr, truncate.take())
            docs, tokens = docs + n_docs, tokens + len(arr)
            bar.update(n_docs, tokens)
            if progress:
                progress(docs, tokens, total_docs)
            if max_tokens is not None and tokens >= max_tokens:
                break
        writer.seal()
    finally:
        writer.close()
        bar.close()
    if docs == 0 or tokens == 0:
        raise EmptyCorpusError(
            f"data.source {config.data.source!r} yielded no documents; check the URL/glob and data.text_field"
        )
    truncated = sum(p.get("truncated", 0) for p in parts)
    if truncated:
        log.warning("%d documents were longer than data.max_document_chars=%d characters and were truncated to it",
                    truncated, config.data.max_document_chars)
    result = Tokenized(directory=str(directory), documents=docs, tokens=tokens, parts=[p["file"] for p in parts],
                       truncated=truncated)
    storage.write_record(str(done_file), result.model_dump(mode="json"))
    return result


class _TokenizeBar:
    """tqdm over documents (rate and ETA when the total is known) with the
    token count and tokens/s alongside; on stderr, so --json stays clean."""

    def __init__(self, enabled: bool, total: int | None, docs: int, tokens: int):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=docs, unit="doc", desc="tokenize", disable=not enabled,
                        smoothing=0.05, dynamic_ncols=True)
        self.start, self.start_tokens = time.perf_counter(), tokens

    def update(self, n_docs: int, tokens: int) -> None:
        rate = (tokens - self.start_tokens) / max(time.perf_counter() - self.start, 1e-9)
        self.bar.update(n_docs)
        self.bar.set_postfix_str(f"{tokens:,} tokens, {rate / 1e6:.2f}M tok/s", refresh=False)

    def close(self) -> None:
        self.bar.close()
