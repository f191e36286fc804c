"""Reading one work unit's documents, in the process that tokenizes it.

Each reader yields the unit's texts in source order and reads only its own
piece: a JSONL byte range (a line belongs to the range it starts in), parquet
row groups, a whole `.json`/`.jsonl.gz` file, or a whole `.txt` file (one
document, read with universal newlines as `datasets` did). They give exactly
the texts `datasets` streaming gave before units existed, so the token stream
did not change. Bad input is a SourceError naming the file and, where known,
the line or row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from gpt2.config.data import SourceError
from gpt2.data.work_unit import Unit
from gpt2.root import storage

BATCH_CHARS = 1 << 22
"""Texts are handed to the encoder in batches of about this many characters:
memory stays bounded whatever the unit's size."""


def iter_text_batches(unit: Unit, text_field: str) -> Iterator[list[str]]:
    """The unit's texts in order, in batches of about BATCH_CHARS characters."""
    readers = {"jsonl": _jsonl_range, "json": _json_file, "parquet": _parquet_groups, "text": _text_file}
    batch, chars = [], 0
    for text in readers[unit.format](unit, text_field):
        batch.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _open(url: str, mode: str = "rb", **kwargs):
    local = storage.local_path(url)
    if local is not None and not kwargs:  # the builtin open: a faster readline than fsspec's wrapper
        return open(local, mode, buffering=1 << 20)  # noqa: SIM115 - closed by the caller's with
    fs, path = storage.filesystem(url)
    return fs.open(path, mode, **kwargs)


def _text_of(doc: object, field: str, url: str, where) -> str:
    """The text of one document; `where` (a string, or a function giving
    one, as a line number costs a read) names it in errors."""
    if not (isinstance(doc, dict) and isinstance(doc.get(field), str)):
        where = where() if callable(where) else where
    if not isinstance(doc, dict):
        raise SourceError(f"{where} of data.source file {url!r} is not a JSON object: one object per document")
    if field not in doc:
        raise SourceError(
            f"documents in {url!r} have no field {field!r} ({where}); available fields: "
            f"{', '.join(sorted(doc))}. Set data.text_field to the one holding the text"
        )
    text = doc[field]
    if not isinstance(text, str):
        raise SourceError(f"field {field!r} in {url!r} holds non-text values ({where}); set data.text_field")
    return text


def _jsonl_range(unit: Unit, field: str) -> Iterator[str]:
    with _open(unit.url) as f:
        pos = unit.start
        if pos > 0:
            f.seek(pos - 1)
            if f.read(1) != b"\n":  # mid-line: that line belongs to the previous range
                pos += len(f.readline())
        while pos < unit.stop:
            line = f.readline()
            if not line:
                return
            start, pos = pos, pos + len(line)
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as err:
                raise SourceError(f"cannot read data.source file {unit.url!r} line {_line_number(unit.url, start)}: "
                                  f"not valid JSON ({err}); fix or remove that line") from None
            yield _text_of(doc, field, unit.url, lambda: f"line {_line_number(unit.url, start)}")


def _line_number(url: str, offset: int) -> int:
    """1-based number of the line starting at byte `offset` (read only on an error)."""
    lines = 1
    with _open(url) as f:
        while offset > 0:
            chunk = f.read(min(offset, 1 << 24))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            offset -= len(chunk)
    return lines


def _json_file(unit: Unit, field: str) -> Iterator[str]:
    """A whole `.json` (a list of objects, an object of columns, or JSON
    lines) or compressed JSONL file."""
    try:
        with _open(unit.url, "rb", compression="infer") as f:
            raw = f.read()
    except (OSError, EOFError) as err:
        raise SourceError(f"cannot read data.source file {unit.url!r}: {type(err).__name__}: {err}") from err
    head = raw.lstrip()[:1]
    if head in (b"[", b"{") and not _is_json_lines(raw):
        try:
            data = json.loads(raw)
        except ValueError as err:
            raise SourceError(f"cannot read data.source file {unit.url!r}: not valid JSON ({err})") from None
        if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
            data = [dict(zip(data, row)) for row in zip(*data.values())]  # columns
        rows = data if isinstance(data, list) else [data]
        for i, doc in enumerate(rows):
            yield _text_of(doc, field, unit.url, f"item {i}")
        return
    for number, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                doc = json.loads(line)
            except ValueError as err:
                raise SourceError(f"cannot read data.source file {unit.url!r} line {number}: not valid JSON ({err})"
                                  ) from None
            yield _text_of(doc, field, unit.url, f"line {number}")


def _is_json_lines(raw: bytes) -> bool:
    first = raw.lstrip().split(b"\n", 1)[0]
    try:
        json.loads(first)
    except ValueError:
        return False
    return raw.strip().count(b"\n") > 0


def _parquet_groups(unit: Unit, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    with _open(unit.url) as f:
        try:
            pf = pq.ParquetFile(f)
        except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a bad footer
            raise SourceError(f"cannot read data.source file {unit.url!r}: {type(err).__name__}: {err}") from err
        names = pf.schema_arrow.names
        if field not in names:
            raise SourceError(
                f"documents in {unit.url!r} have no field {field!r}; available fields: {', '.join(sorted(names))}. "
                "Set data.text_field to the one holding the text"
            )
        row = sum(pf.metadata.row_group(g).num_rows for g in range(unit.start))
        for group in range(unit.start, unit.stop):
            texts = pf.read_row_group(group, columns=[field]).column(0).to_pylist()
            for i, text in enumerate(texts):
                if not isinstance(text, str):
                    raise SourceError(f"field {field!r} in {unit.url!r} holds non-text values (row {row + i}); "
                                      "set data.text_field")
            yield from texts
            row += len(texts)


def _text_file(unit: Unit, field: str) -> Iterator[str]:
    try:
        with _open(unit.url, "r", encoding="utf-8") as f:
            yield f.read()
    except UnicodeDecodeError as err:
        raise SourceError(f"data.source file {unit.url!r} is not UTF-8 text: {err}") from None

