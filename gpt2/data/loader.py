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

While the loader trains on one remote shard, a background thread (on each
machine's local rank 0) downloads and checksums the next one it will need,
through the same cache and record, so crossing a shard boundary costs only
mapping the file. Any time a step still waits for its tokens is counted in
`ShardSource.wait_seconds`, which the training loop reports.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
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

    def __init__(self, manifest_location: str, manifest: Manifest, cache_dir: Path, env: DistEnv,
                 prefetch: bool = True):
        """`cache_dir`: where remote shards are copied (gpt2.layout.shard_cache_dir);
        `prefetch`: fetch the shard named by `prefetch()` in the background."""
        self.manifest_location, self.manifest = manifest_location, manifest
        self.cache_dir, self.env = cache_dir, env
        self.wait_seconds = 0.0
        """Seconds spent in `tokens()` opening shards (waiting for a download,
        a checksum, the other ranks, the id check of the mapping)."""
        self._open: dict[str, np.ndarray] = {}
        self._prefetch = prefetch
        self._remote = storage.local_path(manifest_location) is None  # shards live beside their manifest
        self._lock = threading.Lock()
        # One future per cached file while a fetch of it is in flight or
        # unclaimed: a prefetch and a foreground fetch of one file share it.
        self._fetches: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    def tokens(self, entry: ShardEntry) -> np.ndarray:
        if entry.path not in self._open:
            t0 = time.perf_counter()
            try:
                self._open = {entry.path: self._load(entry)}  # keep one shard mapped at a time
            finally:
                self.wait_seconds += time.perf_counter() - t0
        return self._open[entry.path]

    def prefetch(self, entry: ShardEntry) -> Future | None:
        """Start downloading and checksumming `entry` in the background, when
        its root is remote and this process downloads for its machine; the
        future of that fetch (None when there is nothing to fetch). An error
        is raised by `tokens()` when the shard is needed."""
        if self.env.local_rank != 0 or not self._remote:
            return None
        url = layout.shard(self.manifest_location, entry.path)
        cached = self.cache_dir / cached_name(entry)
        with self._lock:
            if not self._prefetch:
                return None
            if cached.name not in self._fetches:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")
                future = self._pool.submit(self._fetch, url, entry, cached)
                future.add_done_callback(lambda f: _log_failure(f, url))
                self._fetches[cached.name] = future
            return self._fetches[cached.name]

    def in_flight(self, entry: ShardEntry) -> Future | None:
        """The fetch of `entry` under way or done and not yet used, if any (starts nothing)."""
        with self._lock:
            return self._fetches.get(cached_name(entry))

    def close(self) -> None:
        """Drop prefetches not started yet (one under way finishes its file)."""
        with self._lock:
            pool, self._pool, self._prefetch = self._pool, None, False
            self._fetches = {k: f for k, f in self._fetches.items() if not f.cancel()}
        if pool is not None:
            pool.shutdown(wait=False)

    def _load(self, entry: ShardEntry) -> np.ndarray:
        url = layout.shard(self.manifest_location, entry.path)
        local = storage.local_path(url)
        if local is not None:
            verify_shard(url, entry)
            return read_shard(local)
        cached = self.cache_dir / cached_name(entry)
        # One process per machine downloads; the others wait for it.
        if self.env.local_rank == 0:
            self._fetch_now(url, entry, cached)
        barrier(self.env)
        return read_shard(cached)

    def _fetch_now(self, url: str, entry: ShardEntry, cached: Path) -> None:
        """`_fetch` in this thread, after any prefetch of the same file: its
        error is raised here. A prefetch asked for meanwhile waits for this one."""
        mine: Future = Future()
        mine.set_running_or_notify_cancel()
        with self._lock:
            earlier = self._fetches.pop(cached.name, None)
            self._fetches[cached.name] = mine
        try:
            if earlier is not None and not earlier.cancelled():
                earlier.result()
            # After a prefetch this only reads the verified record: the copy
            # is checked against it when used, as without a prefetch.
            self._fetch(url, entry, cached)
            mine.set_result(None)
        except BaseException as err:
            mine.set_exception(err)
            raise
        finally:
            with self._lock:
                if self._fetches.get(cached.name) is mine:
                    del self._fetches[cached.name]

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


def _log_failure(future: Future, url: str) -> None:
    """Said when it happens; raised when the loader reaches the shard."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("prefetching shard %s failed: %s", url, future.exception())


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
        following = self._following(pos.shard)
        if following != pos.shard:
            self.source.prefetch(self.shards[following])
        rank_tokens = self.seqs_per_rank * self.T
        start = pos.offset + self.env.rank * rank_tokens
        buf = host_tensor(tokens[start:start + rank_tokens + 1], self.env.device)
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
        following = self._following(pos.shard)
        if following > pos.shard:
            self.position = LoaderPosition(shard=following, offset=0, epoch=pos.epoch)
        else:
            self.position = LoaderPosition(shard=following, offset=0, epoch=pos.epoch + 1)
            log.info("train split exhausted: starting epoch %d", pos.epoch + 1)

    def _following(self, shard: int) -> int:
        """The usable shard after `shard`: the next one in order, else the first (a new epoch)."""
        later = [i for i in self.usable if i > shard]
        return later[0] if later else self.usable[0]


def host_tensor(tokens: np.ndarray, device: torch.device) -> torch.Tensor:
    """`tokens` as int64 on the host, in pinned memory when they go to a GPU:
    a copy from pinned memory with non_blocking=True is really asynchronous."""
    buf = torch.empty(len(tokens), dtype=torch.int64, pin_memory=device.type == "cuda")
    np.copyto(buf.numpy(), tokens)  # uint16 -> int64 straight into the buffer
    return buf


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
    pin = env.device.type == "cuda"  # copied to the device at every validation: pinned, they go asynchronously
    return [(_pinned(b[:, :-1], pin), _pinned(b[:, 1:], pin)) for b in data.split(micro_batch)]


def _pinned(t: torch.Tensor, pin: bool) -> torch.Tensor:
    return t.contiguous().pin_memory() if pin else t.contiguous()
