"""Remote shards are fetched and verified in the background while the loader
trains on the one before; the time a step still waits is counted; a damaged
shard fails when the loader reaches it; the batches are those without it."""

from __future__ import annotations

import io
import re
import threading
import uuid

import numpy as np
import pytest
import torch

import gpt2.data.manifest as manifest_module
from gpt2.data.llmc import ShardError, write_shard
from gpt2.data.loader import TrainLoader
from gpt2.data.manifest import load_manifest
from gpt2.data.shard_source import ShardSource, cached_name
from gpt2.process.distributed import DistEnv
from gpt2.root import layout, storage
from tests.gpt2.train.fixtures import tiny_config, write_dataset

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
WAIT = 30  # seconds a test waits for a background fetch before failing


@pytest.fixture()
def remote():
    """A remote root (fsspec's memory filesystem) with three 1000-token train
    shards: three 257-token windows each."""
    root = f"memory://prefetch-{uuid.uuid4().hex[:8]}"
    config = tiny_config(root)
    url = write_dataset(config, train_shards=3, shard_tokens=1000, val_tokens=400)
    yield url
    storage.remove(root, recursive=True)


def _loader(url, cache, prefetch=True, env=ENV) -> TrainLoader:
    return TrainLoader(ShardSource(url, load_manifest(url), cache, env, prefetch=prefetch), 32, 256, 4, env)


def _in_main_thread(calls: list) -> list:
    return [url for thread, url in calls if thread == "MainThread"]


@pytest.fixture()
def downloads(monkeypatch):
    """(thread name, url) of every download."""
    calls = []
    real = storage.get_file

    def counted(url, local):
        calls.append((threading.current_thread().name, url))
        real(url, local)

    monkeypatch.setattr(storage, "get_file", counted)
    return calls


def test_the_next_shard_is_fetched_and_verified_before_the_loader_reaches_it(remote, tmp_path, downloads,
                                                                              monkeypatch):
    checksums = []
    real = manifest_module._checksum_and_check_ids

    def counted(url):
        checksums.append((threading.current_thread().name, url))
        return real(url)

    monkeypatch.setattr(manifest_module, "_checksum_and_check_ids", counted)
    ld = _loader(remote, tmp_path)
    first, second, third = ld.shards
    ld.next_batches()
    ld.source.in_flight(second).result(timeout=WAIT)
    assert ld.position.shard == 0
    assert (tmp_path / cached_name(second)).is_file()
    assert (tmp_path / (cached_name(second) + ".verified")).is_file()
    assert len(downloads) == 2 and len(checksums) == 2

    ld.next_batches(), ld.next_batches()  # the rest of shard 0
    ld.next_batches()  # shard 1: no download and no checksum in the step
    assert ld.position.shard == 1
    assert len(_in_main_thread(downloads)) == 1 and len(_in_main_thread(checksums)) == 1  # shard 0's only

    ld.source.in_flight(third).result(timeout=WAIT)
    for _ in range(3):
        ld.next_batches()
    assert ld.position.shard == 2 and len(downloads) == 3
    # The next epoch starts on shard 0 again: verified before, it is only looked up.
    ld.source.in_flight(first).result(timeout=WAIT)
    for _ in range(3):
        ld.next_batches()
    assert (ld.position.shard, ld.position.epoch) == (0, 1)
    assert len(downloads) == 3 and len(checksums) == 3
    assert len(_in_main_thread(downloads)) == 1 and len(_in_main_thread(checksums)) == 1


def test_batches_are_the_same_with_and_without_prefetch(remote, tmp_path):
    on, off = _loader(remote, tmp_path / "on"), _loader(remote, tmp_path / "off", prefetch=False)
    for _ in range(11):  # across every shard boundary and into the next epoch
        a, b = on.next_batches(), off.next_batches()
        assert on.state_dict() == off.state_dict()
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert off.source.prefetch(off.shards[1]) is None and off.source.in_flight(off.shards[1]) is None


def test_without_prefetch_a_shard_is_fetched_when_needed(remote, tmp_path, downloads):
    off = _loader(remote, tmp_path, prefetch=False)
    off.next_batches()
    assert [url for _, url in downloads] == [layout.shard(remote, off.shards[0].path)]


def test_time_waiting_for_a_shard_is_counted(remote, tmp_path, monkeypatch):
    gate = threading.Event()
    real = storage.get_file

    def slow(url, local):
        assert gate.wait(WAIT)
        real(url, local)

    monkeypatch.setattr(storage, "get_file", slow)
    ld = _loader(remote, tmp_path)
    assert ld.source.wait_seconds == 0.0
    timer = threading.Timer(0.3, gate.set)
    timer.start()
    ld.next_batches()  # waits for the download of shard 0
    timer.join()
    waited = ld.source.wait_seconds
    assert waited >= 0.25  # the timer started just before the step
    ld.next_batches()  # the same shard, already mapped: no wait
    assert ld.source.wait_seconds == waited
    ld.source.in_flight(ld.shards[1]).result(timeout=WAIT)
    ld.next_batches(), ld.next_batches()
    assert ld.position.shard == 1 and ld.source.wait_seconds > waited  # mapping shard 1 is counted too
    # The next shard's prefetch ends here, not after the fixture removed the root (it would log its failure).
    next_fetch = ld.source.in_flight(ld.shards[2])
    if next_fetch is not None:
        next_fetch.result(timeout=WAIT)


def test_a_damaged_next_shard_fails_when_the_loader_reaches_it_naming_it(remote, tmp_path):
    entry = load_manifest(remote).split("train")[1]
    buf = io.BytesIO()
    write_shard(buf, np.zeros(1000, dtype=np.uint16))  # same size, other bytes: only the sha256 tells
    shard_url = layout.shard(remote, entry.path)
    storage.write_bytes_atomic(shard_url, buf.getvalue())

    ld = _loader(remote, tmp_path)
    ld.next_batches()
    with pytest.raises(ShardError, match=entry.path):  # the background fetch failed...
        ld.source.in_flight(entry).result(timeout=WAIT)
    ld.next_batches(), ld.next_batches()  # ...and shard 0 trains on regardless
    assert ld.position.shard == 1
    with pytest.raises(ShardError, match=re.escape(shard_url)):  # raised when the shard is needed
        ld.next_batches()
    assert not (tmp_path / cached_name(entry)).exists()


def test_a_fetch_in_the_foreground_and_a_prefetch_of_one_file_download_it_once(remote, tmp_path, monkeypatch):
    started, gate, calls = threading.Event(), threading.Event(), []
    real = storage.get_file

    def held(url, local):
        calls.append(url)
        started.set()
        assert gate.wait(WAIT)
        real(url, local)

    monkeypatch.setattr(storage, "get_file", held)
    source = ShardSource(remote, load_manifest(remote), tmp_path, ENV)
    entry = source.manifest.split("train")[0]
    prefetch = source.prefetch(entry)
    assert started.wait(WAIT)
    got = []
    foreground = threading.Thread(target=lambda: got.append(source.tokens(entry)))
    foreground.start()
    foreground.join(0.2)  # time to reach the fetch in flight (it must wait for it, not start another)
    assert source.prefetch(entry) is not None  # asked again meanwhile: joins, starts nothing
    gate.set()
    foreground.join(WAIT)
    prefetch.result(timeout=WAIT)
    assert len(got) == 1 and len(got[0]) == 1000
    assert len(calls) == 1


def test_only_remote_roots_and_one_process_per_machine_prefetch(remote, tmp_path):
    manifest = load_manifest(remote)
    entry = manifest.split("train")[0]
    other = DistEnv(rank=1, local_rank=1, world_size=1, device=torch.device("cpu"))
    assert ShardSource(remote, manifest, tmp_path, other).prefetch(entry) is None
    local = tiny_config(tmp_path / "root")
    url = write_dataset(local, train_shards=1, shard_tokens=1000, val_tokens=400)
    assert ShardSource(url, load_manifest(url), tmp_path / "c", ENV).prefetch(entry) is None


def test_closing_the_source_stops_prefetching(remote, tmp_path):
    ld = _loader(remote, tmp_path)
    ld.next_batches()
    ld.source.close()
    assert ld.source.prefetch(ld.shards[2]) is None
    for _ in range(3):  # the shard a prefetch may not have fetched is fetched when needed
        ld.next_batches()
    assert ld.position.shard == 1


def test_a_run_fetches_its_first_shards_while_its_model_is_built_and_probed(tmp_path, monkeypatch):
    """#28: the val split's first shard and the train shard the loader starts in
    are asked for right after the checkpoint is chosen, before the micro-batch
    probe (and the compile), instead of by the first step."""
    from gpt2.train import session
    from gpt2.train.run import train

    root = f"memory://first-reads-{uuid.uuid4().hex[:8]}"
    config = tiny_config(root, **{"runtime.work_dir": str(tmp_path / "work"), "train.max_steps": 2,
                                  "train.checkpoint_every": 2, "train.eval_every": 2, "tracking.enabled": False})
    manifest = load_manifest(write_dataset(config))
    expected = [manifest.split("val")[0].path, manifest.split("train")[0].path, "probe"]
    events = []
    prefetch, probe = ShardSource.prefetch, session.choose_micro_batch
    monkeypatch.setattr(ShardSource, "prefetch", lambda self, e: events.append(e.path) or prefetch(self, e))
    monkeypatch.setattr(session, "choose_micro_batch", lambda *a: events.append("probe") or probe(*a))
    try:
        assert train(config).steps == 2
    finally:
        storage.remove(root, recursive=True)
    assert events[:3] == expected


def test_a_resumed_run_prefetches_the_train_shard_its_loader_stands_in(remote):
    from gpt2.data.loader import first_reads

    manifest = load_manifest(remote)
    train = manifest.split("train")
    assert first_reads(manifest, 256, None) == [manifest.split("val")[0], train[0]]
    assert first_reads(manifest, 256, {"shard": 2, "offset": 512, "epoch": 0}) == [manifest.split("val")[0], train[2]]
    # A shard too short for one global batch is never the first the loader reads.
    assert first_reads(manifest, 999, None) == [manifest.split("val")[0], train[0]]
    assert first_reads(manifest, 1000, None) == [manifest.split("val")[0]]
