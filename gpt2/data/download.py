"""Data step 1, download: resolve `data.source` to files on local disk.

Built-in samples are written out, local files are used where they are, and
remote files are copied into the step's work directory. Trial runs (a
document or token limit) stream remote files instead, so they never fetch a
whole 30 GB corpus for a few thousand documents.
"""

from __future__ import annotations

from pathlib import Path

from gpt2 import layout
from gpt2.config import Config
from gpt2.data import sources
from gpt2.data.disk import check_disk


def download_source(config: Config) -> sources.SourceFiles:
    """Resolve the source to files; copy remote ones to local disk, after
    checking the disk the whole data stage will need."""
    source = sources.resolve(config.data)
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


def tokens_done(config: Config) -> bool:
    """Whether the tokenize step's record is there and its parts are whole."""
    from gpt2.data.tokenize import DONE_RECORD, Tokenized, reuse, tokenized_ok

    return reuse(layout.data_step_dir(config, "tokenize") / DONE_RECORD, Tokenized, tokenized_ok) is not None


def source_ok(source: sources.SourceFiles) -> bool:
    """A cached download is good while its local files are still there."""
    return all(sources.is_remote(f) or Path(f).is_file() for f in source.files)


def download_ok(config: Config, source: sources.SourceFiles) -> bool:
    """A cached download is good while its files are there, or once the
    tokens it was for exist (runtime.keep_intermediate may have removed it)."""
    return source_ok(source) or tokens_done(config)
