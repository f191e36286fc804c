"""Data step 2, tokenize: the source's work units into local token parts.

The source is cut into work units (gpt2.data.units: JSONL byte ranges, parquet
row groups, whole files) of at most about `runtime.tokenize_part_tokens`
tokens; an executor (this machine's process pool, gpt2.data.unit_pool, or a
cluster) reads, tokenizes and writes each unit as one part with its record.
This process only hands out units and takes their results in unit order, so
the token stream is the same for any number of workers, a killed run redoes
only the units without a complete record, and data.max_documents /
data.max_tokens stop the handing out once the in-order totals reach them.
Documents longer than `data.max_document_chars` are truncated and counted.
The step's own record (`done.json`) is written last.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gpt2.config.tree import Config
from gpt2.data import sources
from gpt2.data.nanogpt_bin import read_token_files
from gpt2.data.step_record import reuse
from gpt2.data.tokenized import DONE_RECORD, Tokenized, tokenized_ok
from gpt2.data.unit_pool import UnitPool
from gpt2.data.units import completed, fetch, plan_units, tokenize_unit
from gpt2.data.work_unit import Unit, UnitExecutor, UnitResult
from gpt2.errors import UserError
from gpt2.root import layout, storage

log = logging.getLogger(__name__)

Progress = Callable[[int, int, "int | None"], None]
"""progress(documents_done, tokens_done, documents_total_or_None)."""


class EmptyCorpusError(UserError, ValueError):
    """The source yielded no documents or no tokens."""


SMALL_CORPUS_BYTES = 16 << 20
"""Below this, starting worker processes (~1 s each) costs more than it saves."""


def _workers(config: Config, source: sources.SourceFiles) -> int:
    known = source.sizes and all(source.sizes)
    if known and sum(source.sizes) < SMALL_CORPUS_BYTES:
        return 1  # the token stream is the same for any number of workers
    return config.runtime.num_workers


def tokenize_source(config: Config, source: sources.SourceFiles, progress: Progress | None = None,
                    show_progress: bool = True, executor: UnitExecutor | None = None) -> Tokenized:
    """Tokenize the source's work units into local parts, resuming after the
    last complete ones. executor: where units run (None: this machine's
    process pool of runtime.num_workers)."""
    if config.data.source_format == "nanogpt-bin":  # already tokens: checked, never retokenized
        return read_token_files(config, source)
    directory = layout.data_step_dir(config, "tokenize")
    directory.mkdir(parents=True, exist_ok=True)
    done_file = directory / DONE_RECORD
    if done := reuse(done_file, Tokenized, tokenized_ok):
        return done
    for stray in directory.glob("*.tmp"):
        stray.unlink()
    units = plan_units(source, config.runtime.tokenize_part_tokens)
    executor = executor or UnitPool(config, directory, _workers(config, source))
    total_docs = min(filter(None, (sources.count_documents(source), config.data.max_documents)), default=None)
    run = _Coordinator(config, directory, units, _TokenizeBar(show_progress, total_docs), progress, total_docs)
    try:
        run.start()
        run.follow(executor)
    finally:
        run.bar.close()
    if run.docs == 0 or run.tokens == 0:
        raise EmptyCorpusError(
            f"data.source {config.data.source!r} yielded no documents; check the URL/glob and data.text_field"
        )
    if run.truncated:
        log.warning("%d documents were longer than data.max_document_chars=%d characters and were truncated to it",
                    run.truncated, config.data.max_document_chars)
    result = Tokenized(directory=str(directory), documents=run.docs, tokens=run.tokens, parts=run.parts,
                       truncated=run.truncated)
    storage.write_record(str(done_file), result.model_dump(mode="json"))
    return result


class _Coordinator:
    """Hands out units and takes their results in unit order: totals, the
    progress bar, the truncation warning, and the limits. No per-document
    work, except re-tokenizing the one unit where a limit falls."""

    def __init__(self, config: Config, directory: Path, units: list[Unit], bar: _TokenizeBar,
                 progress: Progress | None, total_docs: int | None):
        self.config, self.directory, self.units, self.bar = config, directory, units, bar
        self.progress, self.total_docs = progress, total_docs
        self.ready: dict[int, UnitResult] = {}
        self.next = self.docs = self.tokens = self.truncated = 0
        self.parts: list[str] = []
        self.stopped = False

    def start(self) -> None:
        """Take the units a previous run completed."""
        for unit in self.units:
            if (result := completed(str(self.directory), unit)) is not None:
                self.ready[unit.index] = result
        if self.ready:
            log.info("resuming tokenization: %d of %d units already complete", len(self.ready), len(self.units))
        self._advance()
        self.bar.resumed(self.tokens)

    def follow(self, executor: UnitExecutor) -> None:
        remote = _elsewhere(executor.directory, self.directory)
        results = executor.map(self._pending())
        try:
            for result in results:
                if remote:
                    fetch(result, executor.directory, self.directory, self.units[result.index])
                self.ready[result.index] = result
                self._advance()
                if self.stopped:
                    break
        finally:
            getattr(results, "close", lambda: None)()  # stops a pool at once when the limits are met
        if not self.stopped and self.next < len(self.units):
            raise RuntimeError(f"the unit executor returned no result for {self.units[self.next]}")

    def _pending(self) -> Iterator[Unit]:
        known = set(self.ready) | set(range(self.next))
        for unit in self.units:
            if self.stopped:
                return
            if unit.index not in known:
                yield unit

    def _advance(self) -> None:
        while not self.stopped and self.next in self.ready:
            self._take(self._within_limits(self.ready.pop(self.next)))
            self.next += 1

    def _within_limits(self, result: UnitResult) -> UnitResult:
        max_docs, max_tokens = self.config.data.max_documents, self.config.data.max_tokens
        over_docs = max_docs is not None and self.docs + result.documents > max_docs
        over_tokens = max_tokens is not None and self.tokens + result.tokens > max_tokens
        if not (over_docs or over_tokens):
            return result
        limit = (None if max_docs is None else max_docs - self.docs,
                 None if max_tokens is None else max_tokens - self.tokens)
        # The one unit a limit falls in is tokenized again here, up to the limit.
        return tokenize_unit(self.config, self.units[result.index], str(self.directory), limit)

    def _take(self, result: UnitResult) -> None:
        if result.first_cut and not self.truncated:
            doc, chars = result.first_cut
            log.warning("document %d has %d characters; keeping its first data.max_document_chars=%d "
                        "(further cuts are counted)", self.docs + doc, chars, self.config.data.max_document_chars)
        self.docs, self.tokens = self.docs + result.documents, self.tokens + result.tokens
        self.truncated += result.truncated
        self.parts.append(result.name)
        max_docs, max_tokens = self.config.data.max_documents, self.config.data.max_tokens
        self.stopped = (max_docs is not None and self.docs >= max_docs) or (
            max_tokens is not None and self.tokens >= max_tokens)
        self.bar.update(result.documents, self.tokens)
        if self.progress:
            self.progress(self.docs, self.tokens, self.total_docs)


def _elsewhere(directory: str, local: Path) -> bool:
    """Whether an executor writes somewhere other than the local tokens directory."""
    path = storage.local_path(storage.normalize_url(directory))
    return path is None or path.resolve() != local.resolve()


class _TokenizeBar:
    """tqdm over documents (rate and ETA when the total is known) with the
    token count and tokens/s alongside; on stderr, so --json stays clean."""

    def __init__(self, enabled: bool, total: int | None):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, unit="doc", desc="tokenize", disable=not enabled, smoothing=0.05,
                        dynamic_ncols=True)
        self.start, self.start_tokens = time.perf_counter(), 0

    def resumed(self, tokens: int) -> None:
        """Tokens a previous run made: not counted in the rate."""
        self.start, self.start_tokens = time.perf_counter(), tokens

    def update(self, n_docs: int, tokens: int) -> None:
        rate = (tokens - self.start_tokens) / max(time.perf_counter() - self.start, 1e-9)
        self.bar.update(n_docs)
        self.bar.set_postfix_str(f"{tokens:,} tokens, {rate / 1e6:.2f}M tok/s", refresh=False)

    def close(self) -> None:
        self.bar.close()
