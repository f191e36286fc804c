"""nanoGPT's token files as a source (data.source_format=nanogpt-bin).

nanoGPT's prepare scripts write `train.bin` and `val.bin`: GPT-2 ids as raw
little-endian uint16, no header, each document followed by <|endoftext|>
(50256). Such files are already tokens, so the tokenize step only reads and
checks them: the shard step cuts them into llm.c shards with every id kept as
it is and in order (the end-of-text tokens between documents included), val.bin
as the validation split and train.bin as the train split.

    gpt2 prepare --preset gpt2-124m-owt --set data.source_format=nanogpt-bin --set data.source=gs://bucket/owt/

`data.source` is a folder or glob (local, gs://, s3://, hf://) holding both
files. A `meta.pkl` beside them (nanoGPT's vocabulary for character-level
data) is never opened: unpickling a file from a shared folder runs its code.
Every file is read in chunks of CHUNK_TOKENS, so a 17 GB train.bin never sits
in memory, and checked before any shard is written: an odd byte size, an
llm.c header (an llm.c shard is not a nanoGPT file), or an id outside GPT-2's
vocabulary is refused, naming the file.
"""

from __future__ import annotations

import logging
import posixpath
from pathlib import Path

import numpy as np

from gpt2.config.data import DataConfig, SourceError
from gpt2.config.tree import Config
from gpt2.data.llmc import MAGIC
from gpt2.data.sources import SourceFiles
from gpt2.data.step_record import reuse
from gpt2.data.tokenized import DONE_RECORD, Tokenized, tokenized_ok
from gpt2.root import layout, storage
from gpt2.tokenizer import EOT_TOKEN, N_VOCAB

log = logging.getLogger(__name__)

FORMAT = "nanogpt-bin"
VAL, TRAIN = "val.bin", "train.bin"
NEVER_READ = ("meta.pkl",)
"""Files nanoGPT keeps beside its token files that are left alone."""
CHUNK_TOKENS = 1 << 23
"""Ids read and checked at a time (16 MB)."""


def resolve_token_files(cfg: DataConfig) -> SourceFiles:
    """val.bin and train.bin of the folder or glob `cfg.source`, val first
    (the order of the split shards); the error names what is missing or extra."""
    fs, path = storage.filesystem(cfg.source)
    try:
        if any(ch in path for ch in "*?["):
            paths = sorted(fs.glob(path))
        elif fs.isdir(path):
            paths = sorted(p for p in fs.ls(path, detail=False) if fs.isfile(p))
        else:
            paths = [path] if fs.exists(path) else []
    except FileNotFoundError:
        paths = []
    except Exception as err:  # remote errors: unknown repo, no credentials, ...
        raise SourceError(f"cannot list data.source {cfg.source!r}: {type(err).__name__}: {err}") from err
    named = {posixpath.basename(p): p for p in paths}
    others = sorted(n for n in named if n.endswith(".bin") and n not in (VAL, TRAIN))
    missing = [n for n in (VAL, TRAIN) if n not in named]
    if missing or others:
        problem = f"lacks {' and '.join(missing)}" if missing else f"also holds {', '.join(others)}"
        raise SourceError(f"data.source {cfg.source!r} {problem}: with data.source_format=nanogpt-bin it names a "
                          "folder or glob holding nanoGPT's train.bin and val.bin (and no other .bin files)")
    ignored = sorted(n for n in named if n in NEVER_READ)
    if ignored:
        log.info("data.source %s: %s left unread (nanoGPT's metadata; the ids are GPT-2's)", cfg.source,
                 ", ".join(ignored))
    protocol = cfg.source.split("://", 1)[0] if "://" in cfg.source else "file"
    files = tuple(named[n] if "://" in named[n] or protocol == "file" else f"{protocol}://{named[n]}"
                  for n in (VAL, TRAIN))
    sizes = tuple(int(fs.size(named[n]) or 0) for n in (VAL, TRAIN))
    return SourceFiles(url=cfg.source, format=FORMAT, files=files, sizes=sizes)


def check_token_file(url: str) -> tuple[int, int]:
    """(tokens, documents) of one nanoGPT file, read in chunks; refuses an odd
    size, an llm.c header and ids outside GPT-2's vocabulary, naming the file."""
    name = posixpath.basename(url)
    nbytes = storage.size(url)
    if nbytes is None:
        raise SourceError(f"nanoGPT token file {url} is missing; check data.source")
    if nbytes % 2:
        raise SourceError(f"nanoGPT token file {url} has an odd size ({nbytes} bytes): uint16 ids take 2 bytes "
                          f"each, so it is truncated or not a token file; make {name} again with nanoGPT's prepare.py")
    tokens, documents = nbytes // 2, 0
    fs, path = storage.filesystem(url)
    with fs.open(path, "rb") as f:
        for offset in range(0, tokens, CHUNK_TOKENS):
            ids = np.frombuffer(f.read(2 * min(CHUNK_TOKENS, tokens - offset)), dtype="<u2")
            if offset == 0:
                _refuse_llmc_header(ids, url)
            _refuse_foreign_ids(ids, url, offset)
            documents += int(np.count_nonzero(ids == EOT_TOKEN))
    return tokens, documents


def _refuse_llmc_header(ids: np.ndarray, url: str) -> None:
    first = ids[:2].astype("<u4")
    if len(first) == 2 and int(first[0] | first[1] << 16) == MAGIC:
        raise SourceError(f"{url} starts with llm.c's shard header (magic {MAGIC}): it is an llm.c shard, not a "
                          "nanoGPT token file (raw ids, no header); an llm.c shard needs no data stage: point "
                          "training at its manifest, or give nanoGPT's train.bin and val.bin")


def _refuse_foreign_ids(ids: np.ndarray, url: str, offset: int) -> None:
    if len(ids) and int(ids.max()) >= N_VOCAB:
        at = int(np.argmax(ids >= N_VOCAB))
        raise SourceError(f"nanoGPT token file {url}: token {offset + at} (byte {2 * (offset + at)}) is id "
                          f"{int(ids[at])}, outside GPT-2's vocabulary (< {N_VOCAB}); the file was not made with "
                          "GPT-2's tokenizer (data.source_format=nanogpt-bin reads GPT-2 ids only)")


def read_token_files(config: Config, source: SourceFiles) -> Tokenized:
    """The tokenize step for nanoGPT's files: check both (a remote one is
    copied into the step's directory first) and record them as the token
    stream, val.bin's tokens first, as the val split."""
    directory = layout.data_step_dir(config, "tokenize")
    directory.mkdir(parents=True, exist_ok=True)
    done_file = directory / DONE_RECORD
    if done := reuse(done_file, Tokenized, tokenized_ok):
        return done
    counts = [check_token_file(url) for url in source.files]  # both, before anything is written
    parts = [str(_local_copy(url, directory)) for url in source.files]
    (val_tokens, val_docs), (train_tokens, train_docs) = counts
    if not val_tokens or not train_tokens:
        empty = VAL if not val_tokens else TRAIN
        raise SourceError(f"nanoGPT token file {empty} in data.source {config.data.source!r} is empty")
    result = Tokenized(directory=str(directory), documents=val_docs + train_docs, tokens=val_tokens + train_tokens,
                       parts=parts, val_tokens=val_tokens)
    storage.write_record(str(done_file), result.model_dump(mode="json"))
    return result


def _local_copy(url: str, directory: Path) -> Path:
    """The file on local disk: itself, or a copy in the tokenize directory
    (the shard step maps it; remote files were normally fetched by the download step)."""
    local = storage.local_path(url)
    if local is not None:
        return local.resolve()
    target = directory / posixpath.basename(url)
    if not (target.is_file() and target.stat().st_size == storage.size(url)):
        storage.get_file(url, target)
    return target
