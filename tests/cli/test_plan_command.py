"""`gpt2 plan`: the real command in a subprocess; its numbers checked against
each other and against the formula, never against hard-coded timings."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpt2.report.figures_on_record import RESULTS_ENV
from tests.cli.plan_process import gpt2_plan

# One pytest worker runs this module (--dist loadgroup): its module-scoped fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("plan_command")

REQUIRED = {"tokens", "steps", "gpu_hours", "cost", "micro_batch_size"}


def _run(*args: str, root: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    # No measured figures unless a test gives them: the plan's own assumption (gpt2.cost.measured).
    return gpt2_plan(root, *args, env={RESULTS_ENV: str(root / "no-records.jsonl"), **(env or {})})


def _plan(*args: str, root: Path, env: dict | None = None) -> dict:
    out = _run(*args, "--json", root=root, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("root")


@pytest.fixture(scope="module")
def h100x8(root) -> dict:
    return _plan("--preset", "gpt2-124m", "--gpu", "H100", "--gpus", "8", "--price-per-hour", "25", root=root)


def test_keys_and_arithmetic(h100x8):
    p = h100x8
    assert REQUIRED <= set(p)
    assert p["steps"] == 19_073 and p["tokens"] == 19_073 * 524_288
    assert p["gpu"] == "H100" and p["gpus"] == 8 and p["assumed_mfu"] == 0.4 and p["mfu_from"].startswith("assumed")
    assert p["gpu_hours"] == pytest.approx(p["hours"] * 8)
    assert p["cost"] == pytest.approx(p["hours"] * 25)
    # Time is the FLOPs of the training tokens and the forward-only validation
    # passes over peak × GPUs × MFU.
    val_tokens = p["validation_passes"] * 20 * 524_288
    flops = p["flops_per_token"] * (p["tokens"] + val_tokens / 3)
    assert p["hours"] == pytest.approx(flops / (p["peak_flops"] * 8 * 0.4) / 3600)
    assert p["tokens_per_second"] == pytest.approx(p["peak_flops"] * 8 * 0.4 / p["flops_per_token"])
    # Checkpoints every 500 steps plus the final one; 3 kept; weights + AdamW moments.
    assert p["checkpoints"] == 19_073 // 500 + 1 and p["checkpoints_kept"] == 3
    assert p["checkpoint_bytes"] == 12 * p["params"]
    # A local root holds the shards and the checkpoints (one being written beyond those kept), and
    # the work dir the local copy each save writes before the root's.
    assert p["checkpoints_on_gpu_node"] is True
    assert p["disk_gpu_node_bytes"] == p["shard_bytes"] + (4 + 1) * p["checkpoint_bytes"]
    assert p["shard_bytes"] == 2 * p["data_tokens"] and p["data_tokens"] >= p["tokens"]
    assert p["disk_data_vm_bytes"] >= 3 * p["shard_bytes"]  # parts, shards and the root's copy at least
    assert p["micro_batch_auto"] is True and 64 % p["micro_batch_size"] == 0


def test_doubling_gpus_halves_the_hours_not_the_gpu_hours(h100x8, root):
    p16 = _plan("--preset", "gpt2-124m", "--gpu", "H100", "--gpus", "16", "--price-per-hour", "50", root=root)
    assert p16["hours"] == pytest.approx(h100x8["hours"] / 2)
    assert p16["gpu_hours"] == pytest.approx(h100x8["gpu_hours"])
    assert p16["cost"] == pytest.approx(h100x8["cost"])  # twice the machine for half the time
    assert p16["tokens"] == h100x8["tokens"]


def test_micro_batch_follows_gpu_memory_and_no_price_no_cost(h100x8, root):
    l4 = _plan("--preset", "gpt2-124m", "--gpu", "l4", "--gpus", "8", root=root)
    assert l4["gpu"] == "L4" and l4["cost"] is None
    assert 1 <= l4["micro_batch_size"] <= h100x8["micro_batch_size"]
    assert l4["micro_batch_size"] < h100x8["micro_batch_size"]  # 24 GiB against 80
    assert l4["gpu_hours"] > h100x8["gpu_hours"]  # a smaller peak
    assert l4["gpu_memory_bytes_estimated"] <= 24 * 2**30


def test_set_max_steps_changes_steps_tokens_and_time(h100x8, root):
    p = _plan("--preset", "gpt2-124m", "--gpu", "H100", "--gpus", "8", "--price-per-hour", "25",
              "--set", "train.max_steps=1000", "--set", "train.eval_every=1000", root=root)
    assert p["steps"] == 1000 and p["tokens"] == 1000 * 524_288
    assert p["checkpoints"] == 2 and p["validation_passes"] == 1
    assert p["hours"] < h100x8["hours"]


def test_human_output_states_the_assumptions(root):
    out = _run("--preset", "gpt2-124m", "--gpu", "A100-40GB", "--gpus", "8", "--price-per-hour", "12", root=root)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for expected in ("40% MFU", "GPU-hours", "8 x A100-40GB", "micro-batch", "disk, data VM", "disk, GPU node",
                     "not counted"):
        assert expected in text


def test_unknown_gpu_names_the_known_ones(root):
    out = _run("--gpu", "V100", root=root)
    assert out.returncode == 1
    assert "unknown GPU 'V100'" in out.stderr and "H100" in out.stderr and "L4" in out.stderr


def test_gpu_count_must_split_the_batch(root):
    out = _run("--preset", "gpt2-124m", "--gpus", "3", root=root)
    assert out.returncode == 1 and "multiple of" in out.stderr


def test_the_plan_says_a_measured_mfu_on_that_gpu_and_where_it_comes_from(root):
    """#33: the command's line names the MFU it used and its record (which
    record wins: tests/gpt2/cost/test_plan.py)."""
    records = root / "records.jsonl"
    records.write_text(json.dumps({
        "date": "2026-11-26T10:00:00+00:00", "commit": "abcdef1234", "device": "NVIDIA H100 80GB HBM3",
        "torch": "2.11.0+cu130", "bench": "preflight", "figures": {"preset": "gpt2-124m", "mfu": 0.5}}) + "\n")
    text = _run("--preset", "gpt2-124m", "--gpu", "H100", root=root, env={RESULTS_ENV: str(records)}).stdout
    assert ("at 50% MFU (measured: preflight of gpt2-124m on one NVIDIA H100 80GB HBM3, 2026-11-26, "
            "commit abcdef1") in text


LADDER = "runtime.gpu_pools=gpu-spot:1.1:600:3,gpu:3.9"


def test_a_ladder_adds_each_rungs_time_and_cost_and_keeps_every_other_key(h100x8, root):
    """#44: --json gains `ladder` (a row per rung, the run's device-hours at
    that rung's price per device-hour); every key of the plan without it stays."""
    p = _plan("--preset", "gpt2-124m", "--gpu", "H100", "--gpus", "8", "--price-per-hour", "25",
              "--set", LADDER, root=root)
    assert "ladder" not in h100x8 and set(p) - {"ladder"} == set(h100x8)
    assert {k: p[k] for k in h100x8 if k != "actual"} == {k: v for k, v in h100x8.items() if k != "actual"}
    spot, last = p["ladder"]
    assert {"pool", "price_per_hour", "hours", "cost", "start_timeout_s", "max_preemptions"} <= set(spot)
    assert (spot["pool"], spot["price_per_hour"], spot["start_timeout_s"], spot["max_preemptions"]) == (
        "gpu-spot", 1.1, 600, 3)
    assert spot["hours"] == pytest.approx(p["hours"]) and spot["cost"] == pytest.approx(p["gpu_hours"] * 1.1)
    assert last["pool"] == "gpu" and last["cost"] == pytest.approx(p["gpu_hours"] * 3.9)


def test_human_output_prints_the_ladder_and_the_cost_if_the_run_ends_on_its_last_rung(root):
    plain = _run("--preset", "gpt2-124m", "--gpu", "H100", root=root)
    out = _run("--preset", "gpt2-124m", "--gpu", "H100", "--set", LADDER, root=root)
    assert out.returncode == 0, out.stderr
    assert "ladder" not in plain.stdout and out.stdout.startswith(plain.stdout.rstrip("\n"))
    p = _plan("--preset", "gpt2-124m", "--gpu", "H100", "--set", LADDER, root=root)
    (spot,) = [line for line in out.stdout.splitlines() if line.strip().startswith("gpu-spot")]
    assert "1.10/device-h" in spot and f"cost {p['ladder'][0]['cost']:,.2f}" in " ".join(spot.split())
    assert f"if the run ends on gpu (all of it there): cost {p['ladder'][1]['cost']:,.2f}" in out.stdout
    assert "up to 10 min waiting on the rungs above" in out.stdout
