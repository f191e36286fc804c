"""The data stage as four idempotent steps: download → tokenize → shard → upload.

Each step writes to deterministic places (a local work directory for the
intermediate files, the artifact root for the result) and skips what a
previous, possibly killed, run already finished: tokenizing resumes after the
last complete part, sharding and uploading skip complete files, and the
manifest is written last. Prefect caches the steps (tasks/data.py); this
module works without it (`prepare_data`).

    python -c "from gpt2.data.prepare import prepare_data; from gpt2.overrides import resolve_config; print(prepare_data(resolve_config('smoke')))"
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpt2 import layout, storage
from gpt2.config import Config
from gpt2.data import sources
from gpt2.data.llmc import ShardError, write_shard
from gpt2.data.manifest import Manifest, ShardEntry, verify_manifest, verify_shard
from gpt2.data.tokenize_pool import tokenize_stream
from gpt2.identity import data_fingerprint
from gpt2.tokenizer import EOT_TOKEN, N_VOCAB

log = logging.getLogger(__name__)

Progress = Callable[[int, int, "int | None"], None]
"""progress(documents_done, tokens_done, documents_total_or_None)."""


class EmptyCorpusError(ValueError):
    """The source yielded no documents or no tokens."""


class Tokenized(BaseModel):
    model_config = ConfigDict(frozen=True)
    directory: str
    documents: int
    tokens: int
    parts: list[str]


class LocalShards(BaseModel):
    model_config = ConfigDict(frozen=True)
    directory: str
    shards: list[ShardEntry]
    documents: int


class PrepareResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    manifest: str
    total_tokens: int
    train_tokens: int
    val_tokens: int
    shards: int
    documents: int


# --- validity of each step's outputs (a cached result may outlive its files) ---


def source_ok(source: sources.SourceFiles) -> bool:
    return all(sources.is_remote(f) or Path(f).is_file() for f in source.files)


def tokenized_ok(tok: Tokenized) -> bool:
    return all((Path(tok.directory) / name).is_file() for name in tok.parts)


def local_shards_ok(local: LocalShards) -> bool:
    d = Path(local.directory)
    return all((d / e.path).is_file() and (d / e.path).stat().st_size == e.bytes for e in local.shards)


def _reuse(done_file: Path, model: type[BaseModel], ok: Callable[[Any], bool]) -> Any:
    """A step's completion record, if its files are all still there."""
    if done_file.exists():
        done = model.model_validate_json(done_file.read_text())
        if ok(done):
            return done
        done_file.unlink()
    return None


# --- 1. download ----------------------------------------------------------


def download_source(config: Config) -> sources.SourceFiles:
    """Resolve the source to files; copy remote ones to local disk.

    Trial runs (a document or token limit) stream remote files instead, so
    they never fetch a whole 30 GB corpus for a few thousand documents.
    """
    source = sources.resolve(config.data)
    target = layout.data_step_dir(config, "download")
    if source.builtin:
        return sources.materialize_builtin(source, target)
    limited = config.data.max_documents is not None or config.data.max_tokens is not None
    if limited or not any(sources.is_remote(f) for f in source.files):
        return source
    return sources.download(source, target)


# --- 2. tokenize ----------------------------------------------------------


def _completed_parts(directory: Path) -> list[dict]:
    parts = []
    for meta in sorted(directory.glob("part_*.json")):
        info = json.loads(meta.read_text())
        if (directory / info["file"]).stat().st_size == 2 * info["tokens"]:
            parts.append(info)
        else:  # a part whose data no longer matches its record: redo from here
            break
    return parts


class _PartWriter:
    """Appends token arrays to the current part file; seals a part (rename +
    record) every `part_tokens` tokens so a killed run resumes after it."""

    def __init__(self, directory: Path, parts: list[dict], part_tokens: int):
        self.directory, self.parts, self.part_tokens = directory, parts, part_tokens
        self.file, self.docs, self.tokens = None, 0, 0

    @property
    def _tmp(self) -> Path:
        return self.directory / f"part_{len(self.parts):06d}.bin.tmp"

    def write(self, n_docs: int, arr: np.ndarray) -> None:
        if self.file is None:
            self.file = open(self._tmp, "wb")
        self.file.write(arr.tobytes())
        self.docs, self.tokens = self.docs + n_docs, self.tokens + len(arr)
        if self.tokens >= self.part_tokens:
            self.seal()

    def seal(self) -> None:
        if self.file is None:
            return
        self.file.close()
        self.file = None
        name = f"part_{len(self.parts):06d}"
        os.replace(self._tmp, self.directory / f"{name}.bin")
        info = {"file": f"{name}.bin", "documents": self.docs, "tokens": self.tokens}
        (self.directory / f"{name}.json").write_text(json.dumps(info))
        self.parts.append(info)
        self.docs = self.tokens = 0

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
    done_file = directory / "done.json"
    if done := _reuse(done_file, Tokenized, tokenized_ok):
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
    batches = _limited(
        sources.iter_text_batches(source, config.data.text_field, skip=docs),
        None if max_docs is None else max_docs - docs,
    )
    writer = _PartWriter(directory, parts, config.runtime.tokenize_part_tokens)
    bar = _TokenizeBar(show_progress, total_docs, docs, tokens)
    try:
        for n_docs, arr in tokenize_stream(batches, _workers(config, source)):
            if max_tokens is not None:
                arr = arr[: max_tokens - tokens]  # exact cut: independent of batching
            writer.write(n_docs, arr)
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
    result = Tokenized(directory=str(directory), documents=docs, tokens=tokens, parts=[p["file"] for p in parts])
    done_file.write_text(result.model_dump_json())
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


# --- 3. shard -------------------------------------------------------------


def split_sizes(config: Config, total: int) -> list[tuple[str, int]]:
    """(split, tokens) of every shard: the val slice first, then train.

    The val slice is `data.val_tokens` unless the corpus is smaller than twice
    that; then it is a tenth of the corpus, so small corpora still get both.
    """
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


def _read_stream(tok: Tokenized) -> Iterator[np.ndarray]:
    for name in tok.parts:
        path = Path(tok.directory) / name
        if path.stat().st_size:  # mapped, not read: shards are written from views of the parts
            yield np.memmap(path, dtype=np.uint16, mode="r")


def shard_tokens(config: Config, tok: Tokenized) -> LocalShards:
    """Cut the token stream into llm.c shards in the local work directory."""
    directory = layout.data_step_dir(config, "shard")
    directory.mkdir(parents=True, exist_ok=True)
    done_file = directory / "shards.json"
    if done := _reuse(done_file, LocalShards, local_shards_ok):
        return done
    stream, rest = _read_stream(tok), []
    entries = []
    for index, (split, n) in enumerate(split_sizes(config, tok.tokens)):
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
            sha = write_shard(f, pieces)
        os.replace(tmp, directory / name)
        entries.append(ShardEntry(path=name, split=split, tokens=n, bytes=(directory / name).stat().st_size, sha256=sha))
    result = LocalShards(directory=str(directory), shards=entries, documents=tok.documents)
    done_file.write_text(result.model_dump_json())
    return result


# --- 4. upload ------------------------------------------------------------


def upload_shards(config: Config, local: LocalShards, source: sources.SourceFiles) -> str:
    """Copy shards to the artifact root atomically, then write the manifest last."""
    root = storage.normalize_url(config.runtime.root)
    storage.check_writable(root)
    target, url = layout.data_dir(config), layout.manifest(config)
    for entry in local.shards:
        dest = storage.join(target, entry.path)
        if storage.size(dest) == entry.bytes:
            try:  # uploaded by an earlier, interrupted run: keep it if intact
                verify_shard(dest, entry, checksum=True)
                continue
            except ShardError as err:
                log.warning("replacing %s", err)
        storage.put_file_atomic(Path(local.directory) / entry.path, dest)
    manifest = Manifest(
        name=config.data.name,
        fingerprint=data_fingerprint(config),
        tokenizer={"name": config.data.tokenizer, "eot_token": EOT_TOKEN, "vocab_size": N_VOCAB},
        source={**source.describe(), "documents": local.documents, "text_field": config.data.text_field},
        data_config=config.data.model_dump(mode="json"),
        shards=local.shards,
    )
    # Verify what landed before the manifest declares the stage complete.
    for entry in manifest.shards:
        verify_shard(storage.join(target, entry.path), entry)
    storage.write_json_atomic(url, manifest.model_dump(mode="json"))
    return url


def summarize(url: str, checksum: bool = False) -> PrepareResult:
    """Verify a finished data directory and summarize it."""
    m = verify_manifest(url, checksum=checksum)
    return PrepareResult(
        manifest=url,
        total_tokens=m.total_tokens,
        train_tokens=m.split_tokens("train"),
        val_tokens=m.split_tokens("val"),
        shards=len(m.shards),
        documents=m.source.get("documents", 0),
    )


def prepare_data(config: Config, progress: Progress | None = None, show_progress: bool = True) -> PrepareResult:
    """All four steps in this process; returns at once when already complete."""
    url = layout.manifest(config)
    if storage.exists(url):
        return summarize(url)
    t0 = time.perf_counter()
    source = download_source(config)
    tok = tokenize_source(config, source, progress, show_progress)
    local = shard_tokens(config, tok)
    upload_shards(config, local, source)
    log.info("data stage finished in %.1fs: %d tokens", time.perf_counter() - t0, tok.tokens)
    return summarize(url)
