"""Deterministic training and validation batches from the manifest's shards.

The training stream is defined globally, independent of the device count:
each optimizer step takes one window of `total_batch_tokens + 1` tokens from
the current shard (llm.c's layout: `total_batch_tokens / T` sequences of T
tokens, targets shifted by one). Rank r gets the r-th contiguous slice of the
window and cuts it into micro-batches. The position (shard, offset, epoch) is
global too, so a checkpoint resumed on another number of GPUs continues with
exactly the same global batches.

Shards under a local root are memory-mapped in place; remote shards are
downloaded once into the work directory, named by their content (the
manifest's sha256), and checksummed once: a record beside the copy remembers
the verified sha256, size and mtime, so a second dataset with the same name
and sizes can never be served the first one's bytes. Every shard's ids are
checked against GPT-2's vocabulary when it is opened.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from gpt2 import layout, storage
from gpt2.data.llmc import ShardError, read_shard
from gpt2.data.manifest import Manifest, ShardEntry, verify_shard
from gpt2.train.distributed import DistEnv, barrier

log = logging.getLogger(__name__)


@dataclass
class LoaderPosition:
    """Where the next global batch starts; saved in every checkpoint."""

    shard: int = 0
    offset: int = 0
    epoch: int = 0



class ShardSource:
    """Token arrays of a manifest's shards, local or cached from a remote root."""

    def __init__(self, manifest_location: str, manifest: Manifest, cache_dir: Path, env: DistEnv):
        """`cache_dir`: where remote shards are copied (gpt2.layout.shard_cache_dir)."""
        self.manifest_location, self.manifest = manifest_location, manifest
        self.cache_dir, self.env = cache_dir, env
        self._open: dict[str, np.ndarray] = {}

    def tokens(self, entry: ShardEntry) -> np.ndarray:
        if entry.path not in self._open:
            self._open = {entry.path: self._load(entry)}  # keep one shard mapped at a time
        return self._open[entry.path]

    def _load(self, entry: ShardEntry) -> np.ndarray:
        url = layout.shard(self.manifest_location, entry.path)
        local = storage.local_path(url)
        if local is not None:
            verify_shard(url, entry)
            return read_shard(local)
        cached = self.cache_dir / cached_name(entry)
        # One process per machine downloads; the others wait for it.
        if self.env.local_rank == 0:
            self._fetch(url, entry, cached)
        barrier(self.env)
        return read_shard(cached)

    def _fetch(self, url: str, entry: ShardEntry, cached: Path) -> None:
        if _verified_before(cached, entry):
            return
        if cached.exists():
            try:
                _verify_and_remember(cached, entry)
                return
            except ShardError as err:
                log.warning("cached shard %s is damaged (%s); downloading it again", cached, err)
        log.info("downloading shard %s -> %s", url, cached)
        storage.get_file(url, cached)
        try:
            _verify_and_remember(cached, entry)
        except ShardError as err:
            cached.unlink(missing_ok=True)
            # The copy is gone; name the shard in the root, which is what is wrong.
            raise ShardError(str(err).replace(storage.normalize_url(str(cached)), url)) from None


def cached_name(entry: ShardEntry) -> str:
    """A remote shard's local name: its content hash first, then its name."""
    return f"{entry.sha256[:32]}-{entry.path}"


def _verified_record(cached: Path) -> Path:
    return cached.with_name(cached.name + ".verified")


def _fingerprint_of_file(cached: Path, entry: ShardEntry) -> dict:
    st = cached.stat()
    return {"sha256": entry.sha256, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _verified_before(cached: Path, entry: ShardEntry) -> bool:
    """Whether this very file (same size and mtime) was checksummed against
    `entry`'s sha256 before; a file changed since then is checked again."""
    record = storage.read_record(str(_verified_record(cached)))
    try:
        return record == _fingerprint_of_file(cached, entry)
    except FileNotFoundError:
        return False


def _verify_and_remember(cached: Path, entry: ShardEntry) -> None:
    _verified_record(cached).unlink(missing_ok=True)
    verify_shard(storage.normalize_url(str(cached)), entry, checksum=True)
    storage.write_record(str(_verified_record(cached)), _fingerprint_of_file(cached, entry))


class TrainLoader:
    """This rank's micro-batches of each global batch, in a fixed order."""

    def __init__(self, source: ShardSource, seq_len: int, total_batch_tokens: int,
                 micro_batch: int, env: DistEnv):
        self.source, self.T, self.env = source, seq_len, env
        self.window = total_batch_tokens
        self.seqs_per_rank = total_batch_tokens // (seq_len * env.world_size)
        self.micro_batch = micro_batch
        self.shards = source.manifest.split("train")
        self.usable = [i for i, s in enumerate(self.shards) if s.tokens >= self.window + 1]
        if not self.usable:
            raise ShardError(
                f"no train shard holds one global batch ({self.window + 1} tokens); "
                "lower train.total_batch_tokens or raise data.shard_size"
            )
        self.position = LoaderPosition(shard=self.usable[0])

    @property
    def accumulation_steps(self) -> int:
        return self.seqs_per_rank // self.micro_batch

    def state_dict(self) -> dict:
        return asdict(self.position)

    def load_state_dict(self, state: dict) -> None:
        self.position = LoaderPosition(**state)

    def next_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (inputs, targets) micro-batches of this rank for the next step,
        each of shape (micro_batch, T); advances the global position."""
        pos = self.position
        tokens = self.source.tokens(self.shards[pos.shard])
        rank_tokens = self.seqs_per_rank * self.T
        start = pos.offset + self.env.rank * rank_tokens
        buf = torch.from_numpy(tokens[start:start + rank_tokens + 1].astype(np.int64))
        self._advance()
        step = self.micro_batch * self.T
        batches = []
        for m in range(self.accumulation_steps):
            chunk = buf[m * step:(m + 1) * step + 1]
            # (B*T + 1,) -> inputs (B, T) and the next-token targets (B, T)
            batches.append((chunk[:-1].view(self.micro_batch, self.T), chunk[1:].view(self.micro_batch, self.T)))
        return batches

    def _advance(self) -> None:
        pos = self.position
        pos.offset += self.window
        if pos.offset + self.window + 1 <= self.shards[pos.shard].tokens:
            return
        later = [i for i in self.usable if i > pos.shard]
        if later:
            self.position = LoaderPosition(shard=later[0], offset=0, epoch=pos.epoch)
        else:
            self.position = LoaderPosition(shard=self.usable[0], offset=0, epoch=pos.epoch + 1)
            log.info("train split exhausted: starting epoch %d", pos.epoch + 1)


def val_batches(source: ShardSource, seq_len: int, max_tokens: int, micro_batch: int,
                env: DistEnv) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed validation set: the first `max_tokens` tokens of the val split
    as non-overlapping sequences, dealt round-robin to ranks, in micro-batches."""
    want = max(1, max_tokens // seq_len)
    seqs: list[np.ndarray] = []
    for entry in source.manifest.split("val"):
        tokens = source.tokens(entry)
        n = min((len(tokens) - 1) // seq_len, want - len(seqs))
        # (n*T + 1,) -> n overlapping (T + 1,) windows: inputs plus shifted targets
        seqs.extend(tokens[i * seq_len:(i + 1) * seq_len + 1] for i in range(n))
        if len(seqs) >= want:
            break
    if not seqs:
        raise ShardError(f"the val split holds fewer than {seq_len + 1} tokens; raise data.val_tokens")
    mine = np.stack(seqs[env.rank::env.world_size]).astype(np.int64) if len(seqs) > env.rank else None
    if mine is None:
        return []
    data = torch.from_numpy(mine)
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in data.split(micro_batch)]
