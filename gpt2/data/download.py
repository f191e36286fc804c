"""Data step 1, download: resolve `data.source` to files on local disk.

Built-in samples are written out, local files are used where they are, and
remote files are copied into the step's work directory. Trial runs (a
document or token limit) stream remote files instead, so they never fetch a
whole 30 GB corpus for a few thousand documents.
"""

from __future__ import annotations

from pathlib import Path

from gpt2.config.data import DataConfig
from gpt2.config.tree import Config
from gpt2.data import sources
from gpt2.data.disk import check_disk
from gpt2.data.nanogpt_bin import resolve_token_files
from gpt2.data.tokenized import tokens_done
from gpt2.errors import UserError
from gpt2.root import layout, storage


def resolve_source(cfg: DataConfig) -> sources.SourceFiles:
    """`data.source` as concrete files, read as data.source_format says: text
    files or a built-in sample (gpt2.data.sources), or nanoGPT's train.bin and
    val.bin (gpt2.data.nanogpt_bin). The error names what is missing."""
    if cfg.source_format == "nanogpt-bin":
        return resolve_token_files(cfg)
    return sources.resolve(cfg)


def source_problem(config: Config) -> str | None:
    """What is wrong with a local or built-in `data.source`, said before anything starts (`gpt2
    prepare`, `gpt2 run`: no server, no stage, one line) rather than from inside the data stage
    after a server start. None when it resolves, when it is remote (the network may take a while:
    the data stage says it there), or when the data is prepared already (a source removed after
    its shards were made is rightly not needed)."""
    if sources.is_remote(config.data.source):
        return None
    try:
        resolve_source(config.data)
        return None
    except UserError as err:
        problem = str(err)
    try:
        prepared = storage.exists(layout.manifest(config))
    except Exception:  # noqa: BLE001 - a root that does not answer is the root check's to name
        return None
    return None if prepared else problem


def download_source(config: Config) -> sources.SourceFiles:
    """Resolve the source to files; copy remote ones to local disk, after
    checking the disk the whole data stage will need."""
    source = resolve_source(config.data)
    target = layout.data_step_dir(config, "download")
    if source.builtin:
        return sources.materialize_builtin(source, target)
    if tokens_done(config):
        # The tokens exist (their source copy may be gone, see gpt2.data.disk):
        # nothing to fetch; a re-tokenization would stream the source.
        return source
    check_disk(config, source)
    limited = config.data.max_documents is not None or config.data.max_tokens is not None
    if limited or not any(sources.is_remote(f) for f in source.files):
        return source
    return sources.download(source, target)


def source_ok(source: sources.SourceFiles) -> bool:
    """A cached download is good while its local files are still there."""
    return all(sources.is_remote(f) or Path(f).is_file() for f in source.files)


def download_ok(config: Config, source: sources.SourceFiles) -> bool:
    """A cached download is good while its files are there, or once the
    tokens it was for exist (runtime.keep_intermediate may have removed it)."""
    return source_ok(source) or tokens_done(config)
