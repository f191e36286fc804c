"""Work units of the data stage: pieces of the source that one worker reads,
tokenizes and writes on its own, so that the coordinating process only hands
out units and records their results.

    units = plan_units(source, config.runtime.tokenize_part_tokens)
    result = tokenize_unit(config, units[0], directory)   # in any process that can reach both

A unit is a JSONL byte range (a line belongs to the range it starts in),
consecutive row groups of one parquet file, or a whole `.json`/`.jsonl.gz`/
`.txt` file. Units never span files. Their part files, concatenated in unit
order, are the token stream, the same for any number or kind of workers.
`tokenize_unit` writes `<directory>/part_<index>.bin` (uint16 tokens, each
document preceded by <|endoftext|>) and then its record
`part_<index>.json`, each atomically; a valid record and file make a rerun
return at once, so a killed run loses only the units in flight.

An executor runs units somewhere (gpt2.data.work_unit.UnitExecutor, beside
the Unit and UnitResult it takes and gives): gpt2.data.unit_pool is this
machine's process pool; flows/ may offer a cluster. tokenize_unit takes an
optional `limit` that only the coordinator uses: it re-tokenizes the one unit
where data.max_documents/max_tokens fall, so the stream ends exactly where the
limit says.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from gpt2.config.data import SourceError
from gpt2.config.tree import Config
from gpt2.data.sources import SourceFiles
from gpt2.data.tokenize_pool import encode_batch
from gpt2.data.unit_readers import iter_text_batches
from gpt2.data.work_unit import Unit, UnitResult
from gpt2.root import storage
from gpt2.tokenizer import EOT_TOKEN

SOURCE_BYTES_PER_TOKEN = {"jsonl": 3.5, "parquet": 2.0}
"""Source bytes per token on the low side (as in gpt2.data.disk), so a unit
holds at most about runtime.tokenize_part_tokens tokens."""

UNITS_WANTED = 1024
"""Units are cut smaller than runtime.tokenize_part_tokens when the corpus is
small, down to UNIT_BYTES_WANTED (MIN_UNIT_BYTES for a corpus of a few MB),
so every core gets many units and the last ones finish close together."""

MIN_UNIT_BYTES = 1 << 18
"""The smallest unit, for corpora of a few MB."""

UNIT_BYTES_WANTED = 1 << 20
"""Units are cut no smaller than this when the corpus has room for MIN_UNITS
of them: a unit's fixed CPU cost (its record, fsyncs, rename, hand-off) is
about 1.5-3 ms, 6-13% of encoding 256 KB but under 3% of 1 MB
(bench/tokenize.py), and 1 MB is still only ~0.1 s of one core's encoding."""

MIN_UNITS = 4

Limit = tuple[int | None, int | None]
"""(documents, tokens) to keep from a unit, None for no bound."""


# --- planning ------------------------------------------------------------------


def unit_format(source: SourceFiles, url: str) -> str:
    if source.format == "json":
        return "jsonl" if url.endswith(".jsonl") else "json"
    return source.format


def plan_units(source: SourceFiles, part_tokens: int = 1 << 25) -> list[Unit]:
    """The source's units in stream order; deterministic, reads only metadata
    (file sizes, parquet footers). part_tokens: runtime.tokenize_part_tokens."""
    sizes = source.sizes if source.sizes and all(source.sizes) else tuple(storage.size(u) or 0 for u in source.files)
    total = sum(sizes)
    units: list[tuple[str, str, int, int]] = []
    for url, size in zip(source.files, sizes):
        fmt = unit_format(source, url)
        if fmt == "jsonl":
            step = _unit_bytes(part_tokens, fmt, total)
            units += [(url, fmt, a, min(a + step, size)) for a in range(0, size, step)]
        elif fmt == "parquet":
            units += [(url, fmt, a, b) for a, b in _row_group_spans(url, _unit_bytes(part_tokens, fmt, total))]
        else:
            units.append((url, fmt, 0, size))
    return [Unit(index=i, url=url, format=fmt, start=a, stop=b) for i, (url, fmt, a, b) in enumerate(units)]


def _unit_bytes(part_tokens: int, fmt: str, total: int) -> int:
    most = max(1, int(part_tokens * SOURCE_BYTES_PER_TOKEN[fmt]))
    least = min(UNIT_BYTES_WANTED, max(MIN_UNIT_BYTES, total // MIN_UNITS))
    return min(most, max(total // UNITS_WANTED, least))


def _row_group_spans(url: str, unit_bytes: int) -> list[tuple[int, int]]:
    import pyarrow.parquet as pq

    fs, path = storage.filesystem(url)
    try:
        with fs.open(path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
    except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a bad footer
        raise SourceError(f"cannot read data.source file {url!r}: {type(err).__name__}: {err}") from err
    spans, start, held = [], 0, 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        held += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        if held >= unit_bytes:
            spans.append((start, g + 1))
            start, held = g + 1, 0
    if start < meta.num_row_groups:
        spans.append((start, meta.num_row_groups))
    return spans


# --- running one unit ---------------------------------------------------------------


def completed(directory: str, unit: Unit, limit: Limit | None = None) -> UnitResult | None:
    """The unit's result if its record is valid for this unit and its file is whole."""
    record = storage.read_record(storage.join(directory, unit.record))
    if not isinstance(record, dict):
        return None
    try:
        result = UnitResult.model_validate(record.get("result"))
        same = Unit.model_validate(record.get("unit")) == unit
    except ValidationError:
        return None
    wanted = list(limit) if limit is not None else None
    if not same or record.get("limit") != wanted:
        return None
    return result if storage.size(storage.join(directory, result.name)) == 2 * result.tokens else None


def tokenize_unit(config: Config, unit: Unit, directory: str, limit: Limit | None = None) -> UnitResult:
    """Read, truncate (data.max_document_chars), encode and write one unit, in
    this process. Idempotent: a valid existing record and file are returned as is."""
    return encode_unit(config, unit, directory, limit)()


def encode_unit(config: Config, unit: Unit, directory: str, limit: Limit | None = None
                ) -> Callable[[], UnitResult]:
    """tokenize_unit in two halves: this call reads and encodes the unit into
    a temporary file (the CPU's work) and returns the rest, which makes it
    durable (fsync, rename or upload, record) and returns its result. A pool's
    worker runs the rest on another thread while it encodes its next unit."""
    if (done := completed(directory, unit, limit)) is not None:
        return lambda: done
    local = storage.local_path(storage.normalize_url(directory))
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
    scratch = local if local is not None else Path(tempfile.gettempdir())
    tmp = scratch / f".{unit.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as out:
            result = _encode_into(out, config, unit, limit)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return partial(_commit, tmp, local, directory, unit, limit, result)


def _commit(tmp: Path, local: Path | None, directory: str, unit: Unit, limit: Limit | None,
            result: UnitResult) -> UnitResult:
    try:
        if local is not None:
            # Its bytes are fsynced here; the record's write fsyncs the directory. A
            # crash that loses this rename but keeps the record is caught by
            # completed(), which checks the part's size.
            storage.fsync_file(tmp)
            os.replace(tmp, local / unit.name)
        else:
            storage.put_file_atomic(tmp, storage.join(directory, unit.name))
    finally:
        tmp.unlink(missing_ok=True)
    record = {"unit": unit.model_dump(), "limit": list(limit) if limit else None, "result": result.model_dump()}
    storage.write_record(storage.join(directory, unit.record), record)
    return result


def _encode_into(out, config: Config, unit: Unit, limit: Limit | None) -> UnitResult:
    max_docs, max_tokens = limit or (None, None)
    max_chars = config.data.max_document_chars
    sha, docs, tokens, truncated, first_cut = hashlib.sha256(), 0, 0, 0, None
    for texts in iter_text_batches(unit, config.data.text_field):
        if max_docs is not None:
            texts = texts[: max_docs - docs]
        long = [(i, len(t)) for i, t in enumerate(texts) if len(t) > max_chars]
        if long:
            texts = [t[:max_chars] for t in texts]
        arr = encode_batch(texts)
        n_docs = len(texts)
        if max_tokens is not None and tokens + len(arr) >= max_tokens:
            arr = arr[: max_tokens - tokens]  # exact cut; a document counts if its <|endoftext|> is kept
            n_docs = int(np.count_nonzero(arr == EOT_TOKEN))
            long = [cut for cut in long if cut[0] < n_docs]
        if long and first_cut is None:
            first_cut = (docs + long[0][0], long[0][1])
        out.write(arr.data)
        sha.update(arr.data)
        docs, tokens, truncated = docs + n_docs, tokens + len(arr), truncated + len(long)
        if (max_docs is not None and docs >= max_docs) or (max_tokens is not None and tokens >= max_tokens):
            break
    return UnitResult(index=unit.index, documents=docs, tokens=tokens, truncated=truncated, name=unit.name,
                      sha256=sha.hexdigest(), first_cut=first_cut)


def fetch(result: UnitResult, directory: str, local: Path, unit: Unit) -> None:
    """Copy a unit's part from an executor's remote directory into the local
    tokens directory, checking its sha256, and record it there."""
    target = local / result.name
    if completed(str(local), unit) == result:
        return
    storage.get_file(storage.join(directory, result.name), target)
    with open(target, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != result.sha256:
        target.unlink()
        raise OSError(f"{storage.join(directory, result.name)} does not match its record's sha256 "
                      f"({digest} != {result.sha256}); rerun to tokenize {unit} again")
    record = {"unit": unit.model_dump(), "limit": None, "result": result.model_dump()}
    storage.write_record(str(local / unit.record), record)
