"""A full disk during a checkpoint (the fault soak's question, bench/soak/run.py):
the trainer's work dir and root on a small filesystem of their own, filled
after the step-4 checkpoint. The run fails naming the disk, the step-4
checkpoint stays whole, and once space is freed a rerun continues from it and
ends exactly like an uninterrupted run."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from gpt2.checkpoint import store
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.test_train import weights
from tests.gpt2.train.test_train_process import finish, launch, run_to_end, wait_for
from tests.tiers import SCENARIO

pytestmark = SCENARIO


@pytest.fixture
def small_disk(tmp_path):
    """A 256 MiB tmpfs: the one disk the run uses (mounting needs the right to; without it, skipped)."""
    path = tmp_path / "small"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path) -> None:
    """Take every free byte of the filesystem holding `path`."""
    with open(path / ".ballast", "wb") as out:
        stat = os.statvfs(path)
        os.posix_fallocate(out.fileno(), 0, stat.f_bavail * stat.f_frsize)


def test_a_full_disk_at_a_checkpoint_fails_naming_it_and_the_rerun_continues(tmp_path, small_disk):
    reference = tiny_config(tmp_path / "reference")
    write_dataset(reference)
    expected = run_to_end(reference, tmp_path / "reference")

    config = tiny_config(small_disk / "root", **{"runtime.work_dir": str(small_disk / "work")})
    write_dataset(config)
    proc, lines = launch(config, tmp_path), []
    wait_for(proc, "step_000004 written", lines)
    fill(small_disk)
    code = finish(proc, lines)
    text = "".join(lines)
    assert code != 0, text[-3000:]
    assert "No space left on device" in text or "disk is full" in text, text[-3000:]
    latest = store.latest_checkpoint(config)
    assert latest.endswith("step_000004"), latest
    store.verify_checkpoint(latest)  # whole: every file there, sizes and sha256 as recorded

    (small_disk / ".ballast").unlink()
    result = run_to_end(config, tmp_path)
    assert result["resumed_from_step"] == 4 and result["steps"] == 8
    ours, theirs = weights(result["checkpoint"]), weights(expected["checkpoint"])
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
