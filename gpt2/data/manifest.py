"""`manifest.json`: the list of shards that marks a finished data stage.

Written last, atomically, beside the shards. Shard paths are relative to the
manifest so a data directory can be copied between buckets unchanged. The
root is shared, so a manifest is untrusted input: its shard paths must be
plain file names (checked before any file is touched), and a manifest that
does not parse is an error naming it that `gpt2 prepare` repairs.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpt2.data.llmc import HEADER_BYTES, TOKEN_DTYPE, ShardError, check_token_ids, parse_header, shard_nbytes
from gpt2.root import layout, storage

_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")


def plain_name(value: str) -> str:
    """A file name with no directory part: no separators, no `..`, not
    absolute, not hidden; so joining it to a directory stays inside it."""
    if not _PLAIN_NAME.match(value) or ".." in value:
        raise ValueError(f"{value!r} is not a plain file name (letters, digits, '_', '-', '.'; no '/', no '..')")
    return value


class ManifestError(ShardError):
    """A manifest that does not parse or lists unsafe paths; names the manifest."""


class ShardEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    split: Literal["train", "val"]
    tokens: int
    bytes: int
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    _path_is_a_plain_name = field_validator("path")(plain_name)


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    format: Literal["llmc-shards-v1"] = "llmc-shards-v1"
    name: str
    fingerprint: str
    tokenizer: dict
    source: dict
    data_config: dict
    shards: list[ShardEntry]

    _name_is_a_plain_name = field_validator("name")(plain_name)

    def split(self, split: str) -> list[ShardEntry]:
        return [s for s in self.shards if s.split == split]

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def split_tokens(self, split: str) -> int:
        return sum(s.tokens for s in self.split(split))


def load_manifest(url: str) -> Manifest:
    """The manifest at `url`, validated before any shard it names is touched."""
    try:
        raw = storage.read_bytes(url)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no data manifest at {url}; run `gpt2 prepare` with the same preset, --set and --root first"
        ) from None
    try:
        return Manifest.model_validate_json(raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in err.errors()[:3])
        raise ManifestError(
            f"data manifest {url} is damaged or not one of ours ({problems}); "
            "rerun `gpt2 prepare` with the same preset, --set and --root to rebuild it"
        ) from None


def check_shard_sizes(manifest_url: str, manifest: Manifest) -> None:
    """Before a run's first step: every shard the manifest names is beside it at
    the size it records (one listing of the directory, no reads), so a shard lost
    or cut short is named now rather than when the run reaches it, hours in.
    Checksums stay with the data stage and `gpt2 preflight`."""
    directory = posixpath.dirname(manifest_url)
    sizes = storage.list_sizes(directory)
    missing = [e.path for e in manifest.shards if e.path not in sizes]
    wrong = [f"{e.path} ({sizes[e.path]} bytes, the manifest says {e.bytes})"
             for e in manifest.shards if e.path in sizes and sizes[e.path] != e.bytes]
    if missing or wrong:
        found = "; ".join(filter(None, [f"missing: {', '.join(missing)}" if missing else "",
                                        f"truncated or corrupt: {', '.join(wrong)}" if wrong else ""]))
        raise ShardError(f"shards in {directory} do not match the manifest ({found}); rerun `gpt2 prepare` with "
                         "the same preset, --set and --root: it rebuilds only what is damaged")


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
        raise ShardError(f"shard {url}: header says {n} tokens, the manifest says {entry.tokens}; "
                         "delete it and rerun `gpt2 prepare`")
    if checksum:
        digest = _checksum_and_check_ids(url)
        if digest != entry.sha256:
            raise ShardError(f"shard {url}: sha256 {digest} does not match the manifest; "
                             "delete it and rerun `gpt2 prepare`")


def _checksum_and_check_ids(url: str) -> str:
    """The shard's sha256, checking in the same pass that every id is GPT-2's."""
    digest = hashlib.sha256()
    fs, path = storage.filesystem(url)
    with fs.open(path, "rb") as f:
        header = f.read(HEADER_BYTES)
        digest.update(header)
        offset, carry = 0, b""
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
            block = carry + block
            whole = len(block) - len(block) % TOKEN_DTYPE.itemsize  # a read may end mid-token
            tokens, carry = np.frombuffer(block[:whole], dtype=TOKEN_DTYPE), block[whole:]
            check_token_ids(tokens, url, offset)
            offset += len(tokens)
    return digest.hexdigest()


def verify_manifest(url: str, checksum: bool = False) -> Manifest:
    """Load a manifest and verify every shard it lists; the error names the bad shard."""
    manifest = load_manifest(url)
    for entry in manifest.shards:
        verify_shard(layout.shard(url, entry.path), entry, checksum=checksum)
    return manifest
