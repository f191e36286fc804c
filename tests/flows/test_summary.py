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
