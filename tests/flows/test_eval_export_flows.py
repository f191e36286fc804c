"""The evaluate and export stages end to end: real Prefect server, real
lm-eval, real MLflow (SQLite under the tmp root), the `gpt2` CLI."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

from cli.main import app
from flows.evaluate import eval_flow
from flows.export import export_flow
from gpt2 import layout, storage
from gpt2.checkpoint.store import save_checkpoint
from gpt2.model import GPT
from gpt2.tracking import default_tracking_uri


def make_checkpoint(config, step: int) -> str:
    torch.manual_seed(step)
    model = GPT(config.model)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(20)
    url = layout.checkpoint_dir(layout.run_dir(config), step)
    save_checkpoint(url, model, torch.optim.AdamW(model.parameters()),
                    {"step": step, "config": config.model_dump(mode="json")}, {})
    return url


@pytest.fixture
def stage(smoke_config, tmp_path, prefect_server):
    """A smoke config with one checkpoint (step 60), and the flow arguments for it."""
    config = smoke_config()
    make_checkpoint(config, 60)
    args = dict(preset="smoke", overrides={"runtime.work_dir": config.runtime.work_dir}, root=config.runtime.root)
    return config, args


def last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_eval_flow_logs_to_mlflow_and_is_cached(stage):
    config, args = stage
    result = eval_flow(**args)
    h = result["hellaswag"]
    assert h["n"] == 31 and result["parity"]["agree"] and result["step"] == 60
    assert (h["acc"], h["acc_norm"], h["acc_norm_per_token"]) == tuple(result["native"][k] for k in ("acc", "acc_norm", "acc_norm_per_token"))
    assert storage.read_json(result["result_url"])["hellaswag"] == h

    client = MlflowClient(tracking_uri=default_tracking_uri(config))
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.metrics["hellaswag/acc_norm"] == pytest.approx(h["acc_norm"])
    assert run.data.metrics["hellaswag/acc_norm_per_token"] == pytest.approx(h["acc_norm_per_token"])
    assert not any("," in k for k in run.data.metrics)
    assert run.data.tags["stage"] == "evaluate" and "prefect.flow_run_id" in run.data.tags
    assert [a.path for a in client.list_artifacts(run.info.run_id, "eval")] == ["eval/hellaswag.json"]

    again = eval_flow(**args)
    assert again["cached"] and again["mlflow_run_id"] == result["mlflow_run_id"]
    fewer = eval_flow(**{**args, "overrides": {**args["overrides"], "eval.limit": 5}})
    assert not fewer["cached"] and fewer["hellaswag"]["n"] == 5


def test_export_flow_registers_the_hf_model_with_its_alias(stage, caplog):
    config, args = stage
    mlflow_log = logging.getLogger("mlflow.transformers")  # MLflow's loggers do not reach the root's handler
    mlflow_log.addHandler(caplog.handler)
    try:
        result = export_flow(**args)
    finally:
        mlflow_log.removeHandler(caplog.handler)
    # Our model card goes with the model: MLflow asks the hub for none, and warns of no card or license.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("mlflow") and r.levelno >= logging.WARNING
            and ("card" in r.getMessage() or "license" in r.getMessage())] == []
    assert storage.exists(storage.join(result["hf_dir"], "model.safetensors"))
    assert storage.exists(result["llmc_bin"])
    client = MlflowClient(tracking_uri=default_tracking_uri(config))
    version = client.get_model_version_by_alias("gpt2-smoke", "current")
    assert int(version.version) == result["model_version"]
    assert version.run_id == result["mlflow_run_id"]
    again = export_flow(**args)
    assert again["cached"] and again["model_version"] == result["model_version"]


def test_cli_evaluate_and_export_print_one_json_line(stage):
    config, _ = stage
    common = ["--root", config.runtime.root, "--set", f"runtime.work_dir={config.runtime.work_dir}", "--json"]
    runner = CliRunner()
    out = runner.invoke(app, ["evaluate", *common, "--set", "eval.limit=8"])
    assert out.exit_code == 0, out.output
    result = last_json(out.stdout)
    assert set(result["hellaswag"]) >= {"acc", "acc_norm", "acc_norm_per_token", "n"}
    assert result["hellaswag"]["n"] == 8 and result["mlflow_run_id"]
    out = runner.invoke(app, ["export", *common, "--checkpoint", layout.checkpoint_dir(layout.run_dir(config), 60)])
    assert out.exit_code == 0, out.output
    result = last_json(out.stdout)
    assert {"hf_dir", "llmc_bin", "registered_model", "model_version"} <= set(result)
    assert result["registered_model"] == "gpt2-smoke"


def test_cli_bad_input_fails_clearly(stage, tmp_path):
    config, _ = stage
    runner = CliRunner()
    work = ["--set", f"runtime.work_dir={config.runtime.work_dir}"]

    out = runner.invoke(app, ["evaluate", "--root", str(tmp_path / "empty"), *work])
    assert out.exit_code == 1 and "no complete checkpoint" in out.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"activity_label": "a", "ctx_a": "b", "ctx_b": "", "endings": ["1","2","3","4"], "label": 9}\n')
    out = runner.invoke(app, ["evaluate", "--root", config.runtime.root, *work, "--set", f"eval.hellaswag_source={bad}"])
    assert out.exit_code == 1 and "bad.jsonl line 1: label 9 out of range" in out.stderr

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    ckpt = layout.checkpoint_dir(layout.run_dir(config), 60)
    out = runner.invoke(app, ["export", "--root", str(blocker / "root"), *work, "--checkpoint", ckpt])
    assert out.exit_code == 1 and "is not writable" in out.stderr
    assert blocker.read_text() == "x"
    assert not storage.exists(storage.join(layout.run_dir(config), "export"))


def flip_one_byte(path) -> None:
    """Damage a file without changing its size (what a bad disk or a botched copy does)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damaged_weights_are_neither_evaluated_nor_exported(stage):
    config, _ = stage
    ckpt = layout.checkpoint_dir(layout.run_dir(config), 60)
    flip_one_byte(storage.local_path(storage.join(ckpt, "model.safetensors")))
    common = ["--root", config.runtime.root, "--set", f"runtime.work_dir={config.runtime.work_dir}"]
    runner = CliRunner()
    for command in ("evaluate", "export"):
        out = runner.invoke(app, [command, *common, "--set", "eval.limit=8"])
        assert out.exit_code == 1, out.output
        assert "model.safetensors does not match its COMPLETE marker" in out.stderr
    assert not storage.exists(storage.join(layout.run_dir(config), "export"))
    assert not storage.exists(storage.join(layout.run_dir(config), "eval"))
    client = MlflowClient(tracking_uri=default_tracking_uri(config))
    assert client.search_model_versions("name = 'gpt2-smoke'") == []
