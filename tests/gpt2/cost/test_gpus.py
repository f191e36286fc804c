"""`gpt2 plan` on the GPUs people have (T4, P100, V100 16/32 GB, A10G, L4, RTX 4090/3090):
the real command prints a time, a cost and the memory check, in the precision the card
trains in; a 16 GB card gets a micro-batch its memory holds; a session limit counts sessions."""

from __future__ import annotations

import json
import math

import pytest

from gpt2.config.presets import gpt2_124m
from gpt2.config.tree import Config
from gpt2.cost.gpus import PlanError, gpu, gpu_of_device
from gpt2.cost.plan import make_plan
from tests.cli.plan_process import gpt2_plan

pytestmark = pytest.mark.xdist_group("plan_gpus")

NO_RECORDS = "GPT2_BENCH_RESULTS"  # gpt2.cost.measured's RESULTS_ENV: no measured MFU, the plan's own assumption
CARDS = {"T4": "fp16", "P100": "fp16", "V100-16GB": "fp16", "V100-32GB": "fp16", "A10G": "bf16", "L4": "bf16",
         "RTX4090": "bf16", "RTX3090": "bf16"}


def _config(**train) -> Config:
    config = gpt2_124m()
    return config.model_copy(update={"train": config.train.model_copy(update={"max_steps": 19_073, **train})})


@pytest.mark.parametrize("card", ["T4", "V100-16GB", "RTX4090"])
def test_the_command_prints_a_time_a_cost_and_the_memory_check(card, tmp_path):
    out = gpt2_plan(tmp_path, "--preset", "gpt2-124m", "--gpu", card, "--price-per-hour", "0.35",
                    env={NO_RECORDS: str(tmp_path / "none.jsonl")})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for row in ("time:", "cost:", "micro-batch:", "precision:"):
        assert row in text, text
    assert f"dense {CARDS[card]}" in text and " GiB)" in text
    as_json = gpt2_plan(tmp_path, "--preset", "gpt2-124m", "--gpu", card, "--json",
                        env={NO_RECORDS: str(tmp_path / "none.jsonl")})
    p = json.loads(as_json.stdout.strip().splitlines()[-1])
    assert p["precision"] == CARDS[card] and p["micro_batch_size"] and p["hours"] > 0


@pytest.mark.parametrize(("card", "precision"), CARDS.items())
def test_each_card_plans_in_its_precision_and_its_micro_batch_fits_its_memory(card, precision):
    g = gpu(card)
    p = make_plan(_config(), card, mfu=0.4)
    assert p["precision"] == precision
    assert p["peak_flops"] == (g.peak_flops if precision == "bf16" else g.peak_fp16_flops)
    assert p["micro_batch_size"] and p["gpu_memory_bytes_estimated"] <= g.memory_gib * 2**30
    assert p["hours"] == pytest.approx(p["steps"] * p["total_batch_tokens"] * p["flops_per_token"]
                                       / (p["peak_flops"] * 0.4) / 3600, rel=0.05)


def test_a_t4_takes_days_and_a_nine_hour_limit_means_sessions():
    p = make_plan(_config(), "T4", price_per_hour=0.0)
    assert p["hours"] > 48 and p["cost"] == 0
    assert p["session_hours"] == 9 and p["sessions"] == math.ceil(p["hours"] / 9) > 1
    assert p["redo_hours_per_session"] == pytest.approx(p["hours"] / p["steps"] * 500)
    assert p["checkpoint_every_quarter_hour"] * p["hours"] / p["steps"] <= 0.25
    assert make_plan(_config(), "T4", session_hours=12)["sessions"] == math.ceil(p["hours"] / 12)


def test_a_16gb_card_in_fp16_picks_a_smaller_micro_batch_than_a_32gb_one():
    small, large = make_plan(_config(), "V100-16GB"), make_plan(_config(), "V100-32GB")
    assert small["micro_batch_size"] < large["micro_batch_size"]
    # fp16's scaler holds a few bytes over bf16; fp32 holds wider activations.
    bf16 = make_plan(_config(precision="fp16"), "L4")["gpu_memory_bytes_estimated"]
    assert make_plan(_config(precision="bf16"), "L4")["gpu_memory_bytes_estimated"] < bf16
    assert make_plan(_config(precision="fp32"), "L4")["micro_batch_size"] <= make_plan(_config(), "L4")[
        "micro_batch_size"]


def test_bf16_on_a_card_without_it_is_a_plan_error():
    with pytest.raises(PlanError, match="T4 has no native bf16.*train.precision=fp16"):
        make_plan(_config(precision="bf16"), "T4")


@pytest.mark.parametrize(("device", "name"), [
    ("Tesla T4", "T4"), ("Tesla P100-PCIE-16GB", "P100"), ("Tesla V100-SXM2-16GB", "V100-16GB"),
    ("Tesla V100-SXM2-32GB", "V100-32GB"), ("NVIDIA A10G", "A10G"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
])
def test_cuda_device_names_read_as_the_plans_cards(device, name):
    assert gpu_of_device(device).name == name
