"""Local disk for the data stage: what it will need, checked before any work,
and the intermediate copies removed once nothing needs them.

The data stage keeps up to four copies of a corpus on local disk: the
downloaded source (remote sources only), the token parts, the shards, and,
for a local root, the shards again in the root. At 10B tokens that is ~30 GB
of parquet plus 20 GB per token copy: finding out when the disk fills, hours
into tokenizing, is what this module exists to prevent.

`runtime.keep_intermediate` says what stays once a step's output is safe:
  inputs  (default) what a later change reads: the downloaded source (new
          limits re-tokenize without re-downloading) and the token parts (a
          new data.shard_size re-shards in minutes); the local shards go once
          they are verified in the root;
  all     every copy;
  none    each copy goes as soon as the next step has its output: the least
          disk, but new limits re-download and a new shard size re-tokenizes.
The peak is counted for the chosen mode.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpt2.config.tree import Config
from gpt2.data.sources import SourceFiles, is_remote
from gpt2.errors import UserError
from gpt2.root import layout

log = logging.getLogger(__name__)

# Source bytes per GPT-2 token, on the low side (so tokens and disk are
# over-estimated): English prose is ~4.3 bytes of UTF-8 per token, JSON adds
# keys and escapes; FineWeb-edu's parquet holds ~2.7 bytes per token; nanoGPT's
# token files hold exactly 2.
SOURCE_BYTES_PER_TOKEN = {"parquet": 2.0, "json": 3.5, "text": 3.5, "compressed": 1.0, "nanogpt-bin": 2.0}
TOKEN_BYTES = 2  # uint16 in parts and shards alike
HEADROOM = 1.05  # headers, records, filesystem slack


class NotEnoughDisk(UserError, OSError):
    """Less free local disk than the data stage needs; names paths and sizes."""


@dataclass(frozen=True)
class DiskPlan:
    tokens: int  # estimated (or the data.max_tokens cap)
    needs: dict[str, int]  # bytes per local directory, at the peak
    free: dict[str, int]  # bytes free on each of those directories' filesystems
    estimated: bool

    def shortfalls(self) -> list[str]:
        return [path for path, need in self.needs.items() if need > self.free[path]]

    def describe(self) -> str:
        parts = [f"{_gb(need)} under {path} ({_gb(self.free[path])} free)" for path, need in self.needs.items()]
        kind = "estimated " if self.estimated else ""
        return f"~{self.tokens / 1e9:.2f}B {kind}tokens: needs {'; '.join(parts)}"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def estimate_tokens(config: Config, source: SourceFiles) -> tuple[int, bool] | None:
    """(tokens, estimated) for the source, or None when its size is unknown."""
    cap = config.data.max_tokens
    if not source.sizes or not all(source.sizes):
        return (cap, False) if cap else None
    kind = "compressed" if any(f.endswith(".gz") for f in source.files) else source.format
    tokens = int(sum(source.sizes) / SOURCE_BYTES_PER_TOKEN.get(kind, 1.0))
    if cap and cap <= tokens:
        return cap, False
    return tokens, True


def _filesystem_of(path: Path) -> Path:
    """The nearest existing ancestor: where the directory will be created."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def plan(config: Config, source: SourceFiles) -> DiskPlan | None:
    """The local disk the data stage needs at its peak, per filesystem."""
    estimate = estimate_tokens(config, source)
    if estimate is None:
        return None
    tokens, estimated = estimate
    copy = int(tokens * TOKEN_BYTES * HEADROOM)
    limited = config.data.max_documents is not None or config.data.max_tokens is not None
    download = sum(source.sizes) if not limited and any(is_remote(f) for f in source.files) else 0
    root = layout.local_root(config)
    keep = config.runtime.keep_intermediate
    work = config.runtime.work_root
    # (place, bytes) held at once during each step, for the chosen mode.
    on_root = [(root, copy)] if root is not None else []
    kept_download = download if keep != "none" else 0
    phases = [
        [(work, download), (work, copy)],  # tokenizing: the source and the growing parts
        [(work, kept_download), (work, copy), (work, copy)],  # sharding: parts and shards
        [(work, kept_download), (work, copy if keep != "none" else 0), (work, copy), *on_root],  # uploading
    ]
    needs: dict[str, int] = {}
    by_fs: dict[int, str] = {}
    for phase in phases:
        held: dict[str, int] = {}
        for place, nbytes in phase:
            anchor = _filesystem_of(Path(place))
            key = by_fs.setdefault(os.stat(anchor).st_dev, str(place))  # one entry per filesystem
            held[key] = held.get(key, 0) + nbytes
        for key, nbytes in held.items():
            needs[key] = max(needs.get(key, 0), nbytes)
    free = {path: shutil.disk_usage(_filesystem_of(Path(path))).free for path in needs}
    return DiskPlan(tokens=tokens, needs=needs, free=free, estimated=estimated)


def check_disk(config: Config, source: SourceFiles) -> DiskPlan | None:
    """Say up front what the data stage needs; refuse to start without it."""
    p = plan(config, source)
    if p is None:
        log.info("data stage: source size unknown, local disk needs not estimated")
        return None
    log.info("data stage: %s (runtime.keep_intermediate=%s)", p.describe(), config.runtime.keep_intermediate)
    short = p.shortfalls()
    if short:
        raise NotEnoughDisk(
            f"not enough local disk for the data stage: {p.describe()}. Free space under {', '.join(short)}, "
            "point runtime.work_dir at a larger disk, or set runtime.keep_intermediate=none (keeps least)"
            + (" (token counts are a conservative estimate from the source's size)" if p.estimated else "")
        )
    return p


# What each mode drops once a step has finished: (step finished, step directory removed).
_DROPS = {
    "all": (),
    "inputs": (("upload", "shard"),),
    "none": (("tokenize", "download"), ("shard", "tokenize"), ("upload", "shard")),
}


def remove_intermediates(config: Config, finished: str) -> list[str]:
    """Called when step `finished` has recorded its result: remove the local
    copies runtime.keep_intermediate does not keep. Only the stage's own work
    directories go (the download directory holds copies of remote or built-in
    sources only, never a user's local files). Returns what was removed."""
    removed = []
    for after, step in _DROPS[config.runtime.keep_intermediate]:
        directory = layout.data_step_dir(config, step)
        if after == finished and directory.exists():
            shutil.rmtree(directory)
            removed.append(str(directory))
    if removed:
        log.info("removed local copies no longer needed (runtime.keep_intermediate=%s): %s",
                 config.runtime.keep_intermediate, ", ".join(removed))
    return removed
