"""Data step 4, upload: the shards to the artifact root, then the manifest.

Each shard lands atomically; shards an interrupted run already uploaded are
kept when they verify. The manifest is written last, after every shard is
verified where it landed: its presence means the data stage is complete.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpt2.config.identity import data_fingerprint
from gpt2.config.tree import Config
from gpt2.data import sources
from gpt2.data.llmc import ShardError
from gpt2.data.manifest import Manifest, verify_shard
from gpt2.data.shard import LocalShards
from gpt2.root import layout, storage
from gpt2.root.checks import check_writable
from gpt2.tokenizer import EOT_TOKEN, N_VOCAB

log = logging.getLogger(__name__)


def upload_shards(config: Config, local: LocalShards, source: sources.SourceFiles) -> str:
    """Copy shards to the artifact root atomically, then write the manifest last."""
    check_writable(layout.root(config))
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
    storage.write_record(url, manifest.model_dump(mode="json"))
    return url
