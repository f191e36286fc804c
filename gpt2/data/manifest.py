"""`manifest.json`: the list of shards that marks a finished data stage.

Written last, atomically, beside the shards. Shard paths are relative to the
manifest so a data directory can be copied between buckets unchanged.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpt2 import layout, storage
from gpt2.data.llmc import HEADER_BYTES, ShardError, parse_header, shard_nbytes


class ShardEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    split: Literal["train", "val"]
    tokens: int
    bytes: int
    sha256: str


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    format: Literal["llmc-shards-v1"] = "llmc-shards-v1"
    name: str
    fingerprint: str
    tokenizer: dict
    source: dict
    data_config: dict
    shards: list[ShardEntry]

    def split(self, split: str) -> list[ShardEntry]:
        return [s for s in self.shards if s.split == split]

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def split_tokens(self, split: str) -> int:
        return sum(s.tokens for s in self.split(split))


def load_manifest(url: str) -> Manifest:
    if not storage.exists(url):
        raise FileNotFoundError(f"no data manifest at {url}; run `gpt2 prepare` with the same preset, --set and --root first")
    return Manifest.model_validate(storage.read_json(url))


def verify_shard(url: str, entry: ShardEntry, checksum: bool = False) -> None:
    """Check one shard's existence, size, header and (on demand) sha256."""
    actual = storage.size(url)
    if actual is None:
        raise ShardError(f"shard {url} listed in the manifest is missing; rerun `gpt2 prepare` to rebuild it")
    if actual != entry.bytes or actual != shard_nbytes(entry.tokens):
        raise ShardError(
            f"shard {url} has {actual} bytes, the manifest says {entry.bytes}; it is truncated or corrupt: "
            "delete it and rerun `gpt2 prepare`"
        )
    n = parse_header(storage.read_bytes(url, 0, HEADER_BYTES), url)
    if n != entry.tokens:
        raise ShardError(f"shard {url}: header says {n} tokens, the manifest says {entry.tokens}; delete it and rerun `gpt2 prepare`")
    if checksum:
        digest = hashlib.sha256()
        fs, path = storage.filesystem(url)
        with fs.open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        if digest.hexdigest() != entry.sha256:
            raise ShardError(f"shard {url}: sha256 {digest.hexdigest()} does not match the manifest; delete it and rerun `gpt2 prepare`")


def verify_manifest(url: str, checksum: bool = False) -> Manifest:
    """Load a manifest and verify every shard it lists; the error names the bad shard."""
    manifest = load_manifest(url)
    for entry in manifest.shards:
        verify_shard(layout.shard(url, entry.path), entry, checksum=checksum)
    return manifest
