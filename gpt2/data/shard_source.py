"""The shards a trainer reads: memory-mapped in place under a local root;
under a remote root, copied once into the work directory, named by their
content (the manifest's sha256), and checksummed once: a record beside the
copy remembers the verified sha256, size and mtime, so a second dataset with
the same name and sizes can never be served the first one's bytes. Every
shard's ids are checked against GPT-2's vocabulary when it is opened.

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
from pathlib import Path

import numpy as np

from gpt2.data.llmc import ShardError, read_shard
from gpt2.data.manifest import Manifest, ShardEntry, verify_shard
from gpt2.process.distributed import DistEnv, first_error
from gpt2.root import layout, storage

log = logging.getLogger(__name__)


class ShardSource:
    """Token arrays of a manifest's shards, local or cached from a remote root."""

    def __init__(self, manifest_location: str, manifest: Manifest, cache_dir: Path, env: DistEnv,
                 prefetch: bool = True):
        """`cache_dir`: where remote shards are copied (gpt2.root.layout.shard_cache_dir);
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
        error = None
        if self.env.local_rank == 0:  # one process per machine downloads; the others wait for it
            try:
                self._fetch_now(url, entry, cached)
            except Exception as err:  # noqa: BLE001 - raised below, once every rank knows
                error = err
        # Every rank learns of a failed download here and raises it: the
        # downloader raising alone would leave the others waiting in this collective.
        failed = first_error(error, self.env)
        if error is not None:
            raise error
        if failed is not None:
            raise ShardError(f"rank {failed[0]} could not fetch {url} for its machine: {failed[1]}")
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
