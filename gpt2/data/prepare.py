"""The data stage as four idempotent steps: download → tokenize → shard → upload.

Each step lives in its own module (gpt2.data.download, .tokenize, .shard,
.upload), writes to deterministic places (gpt2.root.layout: a local work directory
for the intermediate files, the artifact root for the result) and skips what a
previous, possibly killed, run already finished. Prefect caches the steps
(tasks/data.py); `prepare_data` runs them all in this process without it.

    python -c "from gpt2.data.prepare import prepare_data; from gpt2.config.overrides import resolve_config; print(prepare_data(resolve_config('smoke')))"
"""

from __future__ import annotations

import logging
import time

from pydantic import BaseModel, ConfigDict

from gpt2.config.tree import Config
from gpt2.data.disk import remove_intermediates
from gpt2.data.download import download_source
from gpt2.data.llmc import ShardError
from gpt2.data.manifest import verify_manifest
from gpt2.data.shard import shard_tokens
from gpt2.data.tokenize import Progress, tokenize_source
from gpt2.data.upload import upload_shards
from gpt2.root import layout, storage

log = logging.getLogger(__name__)


class PrepareResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    manifest: str
    total_tokens: int
    train_tokens: int
    val_tokens: int
    shards: int
    documents: int


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
        try:
            return summarize(url)
        except ShardError as err:  # a torn manifest or a damaged shard: the steps below repair it
            log.warning("existing data is damaged, rebuilding what is missing: %s", err)
    t0 = time.perf_counter()
    source = download_source(config)
    tok = tokenize_source(config, source, progress, show_progress)
    remove_intermediates(config, "tokenize")
    local = shard_tokens(config, tok)
    remove_intermediates(config, "shard")
    upload_shards(config, local, source)
    remove_intermediates(config, "upload")
    log.info("data stage finished in %.1fs: %d tokens", time.perf_counter() - t0, tok.tokens)
    return summarize(url)
