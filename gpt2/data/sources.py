"""Where documents come from: fsspec URLs/globs of files, or the built-in
offline sample. Reading a file's documents is gpt2.data.unit_readers' part.

`data.source` is either an fsspec URL or glob of `.jsonl`/`.json`/`.parquet`/
`.txt` files (`file://`, `gs://`, `s3://`, `hf://datasets/...`) or
`builtin:python-docs`: the reference topics that CPython ships in
`pydoc_data.topics` (~80 documents, ~110k tokens of real English prose), which
lets the smoke preset run with no network. With data.source_format=nanogpt-bin
it names nanoGPT's token files instead (gpt2.data.nanogpt_bin, which reads
them; gpt2.data.download.resolve_source picks the reader).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from gpt2.config.data import BUILTIN_PREFIX, DataConfig, SourceError, builtin_documents
from gpt2.root import storage

log = logging.getLogger(__name__)

FORMATS = {".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".parquet": "parquet", ".txt": "text"}


@dataclass(frozen=True)
class SourceFiles:
    """A resolved source: concrete file URLs of one format."""

    url: str
    format: str  # json (.jsonl, .json, .jsonl.gz), parquet or text
    files: tuple[str, ...]
    sizes: tuple[int, ...] = field(default=())
    builtin: bool = False

    def describe(self) -> dict:
        return {"url": self.url, "format": self.format, "files": len(self.files), "bytes": sum(self.sizes)}


def file_format(path: str) -> str | None:
    for suffix, fmt in sorted(FORMATS.items(), key=lambda kv: -len(kv[0])):
        if path.endswith(suffix):
            return fmt
    return None


def resolve(cfg: DataConfig) -> SourceFiles:
    """Expand `cfg.source` (text files or a built-in sample) into concrete
    files, failing clearly when nothing matches. data.source_format picks
    between this and nanoGPT's token files in gpt2.data.download.resolve_source."""
    if cfg.source.startswith(BUILTIN_PREFIX):
        builtin_documents(cfg.source)  # validates the name
        return SourceFiles(url=cfg.source, format="json", files=(), builtin=True)
    fs, path = storage.filesystem(cfg.source)
    try:
        if any(ch in path for ch in "*?["):
            paths = sorted(fs.glob(path))
        elif fs.isdir(path):
            paths = sorted(p for p in fs.find(path) if file_format(p))
        elif fs.exists(path):
            paths = [path]
        else:
            paths = []
    except FileNotFoundError:
        paths = []
    except Exception as err:  # remote errors: unknown repo, no credentials, ...
        raise SourceError(f"cannot list data.source {cfg.source!r}: {type(err).__name__}: {err}") from err
    if not paths:
        raise SourceError(
            f"no files match data.source {cfg.source!r}; give an fsspec URL or glob of "
            ".jsonl/.json/.parquet/.txt files, or builtin:python-docs"
        )
    formats = {file_format(p) for p in paths}
    if {posixpath.basename(p) for p in paths} & {"train.bin", "val.bin"}:
        raise SourceError(f"data.source {cfg.source!r} holds .bin files: nanoGPT's train.bin/val.bin are tokens, "
                          "not text; read them with data.source_format=nanogpt-bin")
    if None in formats or len(formats) != 1:
        bad = [p for p in paths if file_format(p) is None][:3]
        raise SourceError(
            f"data.source {cfg.source!r} must match files of one format among "
            f"{', '.join(FORMATS)}; got {sorted(str(f) for f in formats)}" + (f" (e.g. {bad})" if bad else "")
        )
    protocol = cfg.source.split("://", 1)[0] if "://" in cfg.source else "file"
    # fsspec lists remote paths without their scheme; the unit readers need it back.
    files = tuple(p if "://" in p or protocol == "file" else f"{protocol}://{p}" for p in paths)
    sizes = tuple(int(fs.size(p) or 0) for p in paths)
    return SourceFiles(url=cfg.source, format=formats.pop(), files=files, sizes=sizes)


def is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def materialize_builtin(source: SourceFiles, directory: Path) -> SourceFiles:
    """Write a built-in source as a JSONL file so it streams like any other."""
    path = directory / f"{source.url.removeprefix(BUILTIN_PREFIX)}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for doc in builtin_documents(source.url):
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    return SourceFiles(url=source.url, format="json", files=(str(path),), sizes=(path.stat().st_size,), builtin=True)


def download(source: SourceFiles, directory: Path, show_progress: bool = True) -> SourceFiles:
    """Copy remote files to a local directory (each atomically; complete ones
    are skipped on a rerun) so tokenizing reads local disk, not the network."""
    from tqdm.auto import tqdm

    local = []
    bar = tqdm(total=sum(source.sizes), unit="B", unit_scale=True, desc="download", disable=not show_progress)
    for url, nbytes in zip(source.files, source.sizes):
        digest = hashlib.sha256(url.encode()).hexdigest()[:8]
        target = directory / f"{digest}-{posixpath.basename(url)}"
        if not (target.exists() and target.stat().st_size == nbytes):
            storage.get_file(url, target)
        bar.update(nbytes)
        local.append(str(target))
    bar.close()
    return SourceFiles(url=source.url, format=source.format, files=tuple(local), sizes=source.sizes)


def count_documents(source: SourceFiles) -> int | None:
    """Number of documents when cheap to know (parquet footers, built-ins), for ETAs."""
    if source.builtin:
        return len(builtin_documents(source.url))
    if source.format != "parquet":
        return None
    try:
        import pyarrow.parquet as pq

        total = 0
        for url in source.files:
            fs, path = storage.filesystem(url)
            with fs.open(path, "rb") as f:
                total += pq.ParquetFile(f).metadata.num_rows
        return total
    except Exception:  # noqa: BLE001 - only an ETA is lost
        log.debug("could not count documents of %s", source.url, exc_info=True)
        return None
