"""The summary a pipeline prints at its end (flows.summary): where report.png is,
and what HellaSwag on the built-in format sample is and what its acc means."""

from __future__ import annotations

import pytest

from flows.summary import where_things_are
from gpt2.config.overrides import resolve_config

RESULT = {"cached_stages": [], "mlflow_url": "http://127.0.0.1:5000/#/experiments/1/runs/" + "a" * 32,
          "final_val_loss": 6.1, "checkpoint": "c", "hf_dir": "h", "llmc_bin": "l", "mlflow_run_id": "a" * 32,
          "registered_model": "m", "model_version": 1, "bill": None,
          "hellaswag": {"acc": 0.0, "acc_norm": 0.3226, "acc_norm_stderr": 0.0853, "n": 31}}


def _summary(tmp_path, preset: str, **result) -> str:
    config = resolve_config(preset, {"runtime.work_dir": str(tmp_path / "work")}, root=str(tmp_path / "root"))
    return where_things_are(config, {**RESULT, **result})


@pytest.mark.parametrize("preset", ["smoke", "gpt2-124m"])
def test_the_summary_names_report_png_on_the_parent_run(tmp_path, preset):
    text = _summary(tmp_path, preset)
    [line] = [line for line in text.splitlines() if "report.png" in line]
    assert f"an artifact of MLflow run {'a' * 32}" in line
    assert "standard error of acc_norm 0.0853" in text


def test_no_report_line_without_a_parent_run(tmp_path):
    assert "report.png" not in _summary(tmp_path, "smoke", mlflow_run_id=None)


def test_acc_on_the_format_sample_is_explained(tmp_path):
    smoke = _summary(tmp_path, "smoke")
    assert "not comparable with GPT-2's 31.1%" in smoke and "right endings are its longest" in smoke
    assert "not normalised by length" in smoke
    assert "right endings" not in _summary(tmp_path, "gpt2-124m")


def test_the_bills_pools_add_up_to_its_total():
    """#64 item 8: a total of 0.029 device-hours beside a by-pool line of 0.018 could not be reconciled."""
    from flows.summary import describe_bill
    from gpt2.train.bill import pipeline_bill

    train = {"attempts": 3, "device_hours": 0.020, "cost": None,
             "pools": {"gpu": {"attempts": 2, "device_hours": 0.011, "cost": None, "price_per_hour": None},
                       "unknown": {"attempts": 1, "device_hours": 0.009, "cost": None, "price_per_hour": None}}}
    bill = pipeline_bill(train, cpu_hours=0.01, gpu_stage_hours=0.007, price_per_hour=None, cpu_price_per_hour=None,
                         gpu_stage_pool="gpu")
    line = describe_bill(bill)
    assert "0.027 device-hours" in line and "by pool: gpu 2 attempt(s), 0.018 device-hours" in line
    assert "no pool recorded 1 attempt(s), 0.009 device-hours" in line  # 0.018 + 0.009 = 0.027
    del bill["pools"]["unknown"], bill["pools"]["gpu"]
    bill["pools"]["gpu"] = {"attempts": 3, "device_hours": 0.027, "cost": None}
    assert "no pool recorded" not in describe_bill(bill)  # nothing to reconcile
