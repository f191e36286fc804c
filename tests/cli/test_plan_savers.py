"""`gpt2 plan` says which memory savers a preset needs on a GPU (ZeRO-1,
activation recomputation), walking the same candidates as the trainer's search."""

from __future__ import annotations

import json
import subprocess

import pytest

from gpt2.config.overrides import resolve_config
from gpt2.cost.plan import expected_fit, make_plan
from gpt2.train.memory import estimate_multi_rank_bytes, estimate_step_bytes
from gpt2.train.step import MemorySettings
from tests.cli.plan_process import gpt2_plan


def _plan(tmp_path, preset, gpu, gpus, **sets):
    return make_plan(resolve_config(preset, sets, root=str(tmp_path / "root")), gpu, gpus)


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    out = gpt2_plan(tmp_path / "root", *args)
    assert out.returncode == 0, out.stderr
    return out


def test_the_largest_gpt2_on_a_small_gpu_needs_both_and_the_smallest_on_h100_neither(tmp_path):
    big = json.loads(_cli(tmp_path, "--preset", "gpt2-1558m", "--gpu", "A100-40GB", "--gpus", "8",
                          "--json").stdout.strip().splitlines()[-1])
    assert big["shard_optimizer"] is True and big["recompute"] is True and big["micro_batch_size"] >= 1
    assert big["gpu_memory_bytes_estimated"] <= big["gpu_memory_gib"] * 2**30
    small = json.loads(_cli(tmp_path, "--preset", "gpt2-124m", "--gpu", "H100", "--gpus", "8",
                            "--json").stdout.strip().splitlines()[-1])
    assert small["shard_optimizer"] is False and small["recompute"] is False
    text = _cli(tmp_path, "--preset", "gpt2-1558m", "--gpu", "A100-40GB", "--gpus", "8").stdout
    assert "ZeRO-1" in text and "activation recomputation" in text
    assert "memory savers:  none needed" in _cli(tmp_path, "--preset", "gpt2-124m", "--gpu", "H100").stdout


def test_explicit_settings_are_kept_and_one_gpu_has_nothing_to_shard(tmp_path):
    auto = _plan(tmp_path, "gpt2-1558m", "A100-40GB", 8)
    off = _plan(tmp_path, "gpt2-1558m", "A100-40GB", 8, **{"runtime.shard_optimizer": False,
                                                         "runtime.recompute": False})
    # Without the savers 8 sequences no longer fit: the micro-batch halves instead (or nothing fits).
    assert off["shard_optimizer"] is False and off["recompute"] is False
    assert off["micro_batch_size"] is None or off["micro_batch_size"] < auto["micro_batch_size"]
    forced = _plan(tmp_path, "gpt2-124m", "H100", 8, **{"runtime.shard_optimizer": True, "runtime.recompute": True})
    assert forced["shard_optimizer"] is True and forced["recompute"] is True
    one = _plan(tmp_path, "gpt2-1558m", "H200", 1)
    assert one["shard_optimizer"] is False


def test_recomputation_is_tried_only_before_halving_below_the_floor():
    # Fits plainly at 8 only: 16 is never recomputed, since halving to 8 is cheap.
    assert expected_fit(16, lambda b, s: b <= 8 and not s.recompute, "auto", "auto", 1) == (8, MemorySettings())
    assert expected_fit(16, lambda b, s: s.recompute, "auto", "auto", 1) == (8, MemorySettings(False, True))
    assert expected_fit(16, lambda b, s: False, "auto", "auto", 2) == (0, MemorySettings(True, True))


@pytest.mark.parametrize("shards, recompute", [(8, False), (1, True)])
def test_the_plan_estimate_is_the_memory_model(tmp_path, shards, recompute):
    p = _plan(tmp_path, "gpt2-1558m", "A100-40GB", 8)
    args = (p["params"], 48, 1600, 50304, 1024 * p["micro_batch_size"])
    # The step's memory with both savers, and NCCL's buffers beside it on each of the 8 GPUs.
    assert p["gpu_memory_bytes_estimated"] == estimate_step_bytes(*args, 8, True) + estimate_multi_rank_bytes(8)
    assert estimate_step_bytes(*args, shards, recompute) > p["gpu_memory_bytes_estimated"]
