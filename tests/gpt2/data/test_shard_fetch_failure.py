"""A remote shard that the downloading rank (local rank 0) cannot fetch ends
every rank with that download's error: the others, which wait for the
download in the same collective, learn of it there instead of being left in
a collective the downloader never joins.

A real two-rank `train()` on two gloo processes against a GCS root (the
emulator), in a subprocess bounded by a timeout far below the collective
timeout, so a hang fails the test."""

from __future__ import annotations

from pathlib import Path

from gpt2.data.manifest import load_manifest
from gpt2.root import layout, storage
from gpt2.train.run import train
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.two_ranks import join_as, record_outcome, run_pair, spawn
from tests.tiers import SCENARIO

pytestmark = SCENARIO

RUN_TIMEOUT_S = 240


def _config(root: str, tmp: Path):
    return tiny_config(root, **{"runtime.work_dir": str(tmp / "work"),
                                "runtime.collective_timeout_s": 50 * RUN_TIMEOUT_S})


def _worker(rank: int, root: str, tmp: str, port: int) -> None:
    join_as(rank, port)
    record_outcome(tmp, rank, lambda: train(_config(root, Path(tmp))))


def main(root: str, tmp: str) -> None:
    spawn(_worker, root, tmp)


def test_a_shard_the_downloader_cannot_fetch_ends_every_rank_with_its_error(gcs_emulator, tmp_path):
    config = _config(gcs_emulator, tmp_path)
    # Small shards, so training reaches the second one within the run.
    url = write_dataset(config, train_shards=2, shard_tokens=4 * config.train.total_batch_tokens)
    second = [e for e in load_manifest(url).shards if e.split == "train"][1]
    damaged = layout.shard(url, second.path)
    data = bytearray(storage.read_bytes(damaged))
    data[-1] ^= 1  # one token changed: the size still matches, the sha256 does not
    storage.write_bytes_atomic(damaged, bytes(data))

    code = f"from tests.gpt2.data.test_shard_fetch_failure import main; main({gcs_emulator!r}, {str(tmp_path)!r})"
    # The emulator takes no credentials.
    ranks = run_pair(code, tmp_path, timeout=RUN_TIMEOUT_S, env={"FSSPEC_GCS_TOKEN": "anon"})

    assert "result" not in ranks[0] and "result" not in ranks[1]
    own = ranks[0]["error"]
    assert own.startswith("ShardError: ") and damaged in own and "sha256" in own
    # Rank 1 waited for rank 0's download: it ends with the same error, named as rank 0's.
    assert ranks[1]["error"].startswith(f"TrainingError: rank 0 failed: {own}; every rank stopped after step ")
