"""gpt2.cost.plan's pieces: GPU lookup, the micro-batch search it mirrors, the
checkpoint size against a real checkpoint, the memory estimate's shape."""

from __future__ import annotations

import pytest
import torch

from gpt2.cost.gpus import PlanError, gpu
from gpt2.cost.plan import CHECKPOINT_BYTES_PER_PARAM, count_every, expected_micro_batch, make_plan
from gpt2.train.memory import estimate_step_bytes


def test_gpu_names_are_matched_loosely_and_unknown_ones_listed():
    assert gpu("a100-40gb").memory_gib == 40 and gpu("A100").memory_gib == 80
    assert gpu("rtx4090").name == "RTX 4090" and gpu("H100").peak_flops == 989e12
    assert gpu("L4").peak_flops == 121e12 and gpu("L40S").peak_flops == 362e12
    with pytest.raises(PlanError, match="known: H100"):
        gpu("TPU")


def test_count_every_includes_the_final_step_once():
    assert count_every(1000, 500) == 2 and count_every(1001, 500) == 3 and count_every(10, 500) == 1


def test_expected_micro_batch_mirrors_the_halving_search():
    assert expected_micro_batch(64, lambda b: b <= 100) == 64
    assert expected_micro_batch(64, lambda b: b <= 40) == 32
    assert expected_micro_batch(48, lambda b: b <= 20) == 12  # 48 -> largest divisor <= 24 -> <= 12
    assert expected_micro_batch(8, lambda b: False) == 0


def test_memory_estimate_grows_with_the_batch():
    a, b = (estimate_step_bytes(124_000_000, 12, 768, 50304, n * 1024) for n in (16, 32))
    assert 0 < a < b


def test_checkpoint_size_matches_a_real_checkpoint(tmp_path, smoke_config):
    from gpt2.checkpoint import store
    from gpt2.model import GPT
    from gpt2.train.optim import make_optimizer

    config = smoke_config()
    model = GPT(config.model)
    optimizer = make_optimizer(model, config.train, "cpu")
    x = torch.randint(0, 50257, (2, 16))
    model(x, x)[1].backward()
    optimizer.step()
    url = f"file://{tmp_path}/step_000001"
    store.save_checkpoint(url, model, optimizer, {"step": 1}, {})
    total = sum(f.stat().st_size for f in (tmp_path / "step_000001").iterdir())
    expected = CHECKPOINT_BYTES_PER_PARAM * model.num_params(non_embedding=False)
    assert expected <= total <= expected * 1.01


def test_plan_of_the_smoke_preset(smoke_config):
    p = make_plan(smoke_config(), "H100", 1, 10.0)
    assert p["micro_batch_size"] == 4 and p["micro_batch_auto"] is False and p["accumulation_steps"] == 2
    assert p["source_size"] == "measured" and p["checkpoints"] == 3
    assert p["cost"] == pytest.approx(p["hours"] * 10.0)
    with pytest.raises(PlanError, match="does not divide"):
        make_plan(smoke_config(**{"train.micro_batch_size": 3}), "H100")


def test_a_measured_mfu_on_that_gpu_replaces_the_assumption_and_says_where_it_comes_from(tmp_path, monkeypatch):
    """#33: the newest record of the preset on that GPU model wins; another GPU, another preset,
    a torn line and an older record do not count; --mfu still decides; without a record, 40%."""
    import json

    from gpt2.config.overrides import resolve_config
    from gpt2.report.figures_on_record import RESULTS_ENV

    records = tmp_path / "records.jsonl"
    line = {"date": "2026-11-26T10:00:00+00:00", "commit": "abcdef1234", "device": "NVIDIA H100 80GB HBM3",
            "torch": "2.11.0+cu130", "bench": "preflight", "figures": {"preset": "gpt2-124m", "mfu": 0.5}}
    older = {**line, "date": "2026-11-20T10:00:00+00:00", "figures": {"preset": "gpt2-124m", "mfu": 0.3}}
    other_gpu = {**line, "date": "2026-11-27T10:00:00+00:00", "device": "NVIDIA A100-SXM4-80GB"}
    other_preset = {**line, "date": "2026-11-27T10:00:00+00:00", "figures": {"preset": "gpt2-350m", "mfu": 0.6}}
    records.write_text("\n".join([json.dumps(older), json.dumps(line), "{torn", json.dumps(other_gpu),
                                   json.dumps(other_preset)]) + "\n")
    config = resolve_config("gpt2-124m", [], root=str(tmp_path / "root"))
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "no-records.jsonl"))
    assumed = make_plan(config, "H100", 8, 25.0)
    assert assumed["assumed_mfu"] == 0.4 and assumed["mfu_from"].startswith("assumed")
    monkeypatch.setenv(RESULTS_ENV, str(records))
    p = make_plan(config, "H100", 8, 25.0)
    assert p["assumed_mfu"] == 0.5 and "preflight of gpt2-124m on one NVIDIA H100" in p["mfu_from"]
    assert "abcdef1" in p["mfu_from"] and "2026-11-26" in p["mfu_from"]
    assert p["hours"] == pytest.approx(assumed["hours"] * 0.4 / 0.5)  # the same FLOPs at the measured rate
    given = make_plan(config, "H100", 1, None, 0.25)
    assert given["assumed_mfu"] == 0.25 and given["mfu_from"] == "given (--mfu)"
    a100 = make_plan(resolve_config("gpt2-774m", [], root=str(tmp_path / "root")), "A100")
    assert a100["assumed_mfu"] == 0.4 and a100["mfu_from"].startswith("assumed: no measurement of gpt2-774m on A100")



def test_a_ladder_prices_each_rung_for_the_whole_run_and_counts_the_waits_before_it(smoke_config):
    """#44: each rung at its own price (else runtime.price_per_hour, else the
    machine's price split over its GPUs), the run's device-hours on every rung,
    and the last rung's row is the cost if the run ends there."""
    ladder = "gpu-spot:1.1:600:3,gpu-sky::300:2,gpu:3.9"
    p = make_plan(smoke_config(**{"runtime.gpu_pools": ladder}), "H100", 2, 10.0)
    spot, sky, last = p["ladder"]
    assert [r["pool"] for r in p["ladder"]] == ["gpu-spot", "gpu-sky", "gpu"]
    assert (spot["price_per_hour"], sky["price_per_hour"], last["price_per_hour"]) == (1.1, 5.0, 3.9)
    assert all(r["hours"] == p["hours"] and r["device_hours"] == p["gpu_hours"] for r in p["ladder"])
    assert spot["cost"] == pytest.approx(p["gpu_hours"] * 1.1) and last["cost"] == pytest.approx(p["gpu_hours"] * 3.9)
    assert [r["waits_before_s"] for r in p["ladder"]] == [0, 600, 900]
    assert (sky["start_timeout_s"], sky["max_preemptions"]) == (300, 2)
    assert p["cost"] == pytest.approx(p["hours"] * 10.0)  # the machine's cost is as before

    device_price = make_plan(smoke_config(**{"runtime.gpu_pools": ladder, "runtime.price_per_hour": 2.0}), "H100")
    assert device_price["ladder"][1]["price_per_hour"] == 2.0  # runtime.price_per_hour before --price-per-hour
    unpriced = make_plan(smoke_config(**{"runtime.gpu_pools": "gpu-spot,gpu"}), "H100")
    assert [r["cost"] for r in unpriced["ladder"]] == [None, None]


def test_without_a_ladder_the_plan_has_no_ladder_key(smoke_config):
    assert "ladder" not in make_plan(smoke_config(), "H100", 1, 10.0)


def test_an_openwebtext_reproduction_is_planned_on_its_tokens_and_gpt2_124ms_measured_speed(tmp_path):
    """`gpt2 plan --preset gpt2-124m-owt` before the data stage: one epoch of
    OpenWebText's published ~9.04B train tokens, timed at the MFU measured for
    gpt2-124m (the same step; only the data differs)."""
    from gpt2.config.overrides import resolve_config

    owt, fineweb = (make_plan(resolve_config(p, root=str(tmp_path / p)), "H100", gpus=8)
                    for p in ("gpt2-124m-owt", "gpt2-124m"))
    assert owt["steps"] == 9_035_582_198 // 524_288 == 17_234 and owt["steps_from"] == "assumed"
    assert "~9.04B train tokens" in owt["steps_note"]
    assert (owt["assumed_mfu"], owt["mfu_from"]) == (fineweb["assumed_mfu"], fineweb["mfu_from"])
    assert owt["hours"] == pytest.approx(fineweb["hours"] * 17_234 / 19_073, rel=0.01)


def test_the_assumed_mfu_says_it_is_optimistic_on_a_card_without_bf16(tmp_path, monkeypatch):
    """#64 item 8: `gpt2 plan --gpu T4` assumed 40% MFU as if it were an H100's."""
    from gpt2.config.overrides import resolve_config

    monkeypatch.setenv("GPT2_BENCH_RESULTS", str(tmp_path / "no-records.jsonl"))  # nothing measured anywhere
    config = resolve_config("gpt2-124m", root=str(tmp_path / "root"))
    t4, h100 = make_plan(config, "T4", gpus=1), make_plan(config, "H100", gpus=1)
    assert t4["assumed_mfu"] == h100["assumed_mfu"] and t4["mfu_from"].startswith("assumed")
    assert "optimistic on a card without bf16 such as the T4" in t4["mfu_from"]
    assert "optimistic" not in h100["mfu_from"]


def test_a_fine_tunes_plan_says_its_weights_are_read_first_once(tmp_path):
    """#60: the plan of a fine-tune names the weights it reads before the first step (their fp32
    size, once into the root); a scratch plan keeps exactly its keys."""
    from cli.plan import describe
    from gpt2.config.overrides import resolve_config

    config = resolve_config("gpt2-124m-finetune", {"runtime.work_dir": str(tmp_path / "work")}, root=str(tmp_path))
    plan = make_plan(config, "H100")
    assert plan["init"] == {"source": "hf://openai-community/gpt2", "bytes": plan["params"] * 4, "fetched": False}
    assert "weights:        hf://openai-community/gpt2: ~0.5 GB (fp32) read once into the root's weights/" in describe(plan)
    assert "init" not in make_plan(resolve_config("gpt2-124m", root=str(tmp_path)), "H100")
