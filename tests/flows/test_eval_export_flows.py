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
from gpt2.checkpoint.store import save_checkpoint
from gpt2.model import GPT
from gpt2.root import layout, storage
from gpt2.tracking.store import default_tracking_uri


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


def registered_model(config, monkeypatch):
    """`models:/gpt2-smoke@current` loaded as users load it: MLflow's pyfunc loader."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", default_tracking_uri(config))
    return mlflow.pyfunc.load_model("models:/gpt2-smoke@current")


def n_tokens(text: str) -> int:
    from gpt2.tokenizer import get_encoding

    return len(get_encoding("gpt2").encode(text, allowed_special="all"))


@pytest.mark.e2e  # MLflow's loading and scoring code on a registered export: seconds of the quick tier's budget
def test_the_registered_model_answers_with_and_without_params_loaded_and_scored(stage, monkeypatch):
    config, args = stage
    result = export_flow(**args)
    model = registered_model(config, monkeypatch)
    meta = model.metadata
    params = {p.name: p.default for p in meta.get_params_schema().params}
    assert params == {"max_new_tokens": 32, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "do_sample": True}
    assert meta.flavors["python_function"]["config"] == {"max_new_tokens": 32, "handle_long_generation": "hole"}
    assert meta.saved_input_example_info is not None

    answer = model.predict(["def"])  # MLflow's default length here used to run off 64 positions
    assert len(answer) == 1 and isinstance(answer[0], str) and n_tokens(answer[0]) <= 33
    short = model.predict(["def", "class"], params={"max_new_tokens": 3, "do_sample": False})
    assert len(short) == 2 and all(n_tokens(a) <= 4 for a in short)
    assert model.predict(["def"], params={"max_new_tokens": 3, "do_sample": False}) == short[:1]  # greedy: the same
    # A prompt longer than the positions: its start is cut, the answer still comes.
    assert isinstance(model.predict([" x" * 200], params={"max_new_tokens": 3})[0], str)

    client = MlflowClient(tracking_uri=default_tracking_uri(config))
    description = client.get_model_version("gpt2-smoke", str(result["model_version"])).description
    assert description.startswith("# gpt2-smoke\n") and "2 layers, 2 heads, 64 channels" in description
    assert "**HellaSwag**: not evaluated yet" in description and "gpt2 run --preset smoke" in description

    # MLflow's own scoring app (what `mlflow models serve` runs; its process in the end-to-end tier), in process.
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    app = TestClient(scoring_server.init(model))
    for body in ({"inputs": ["def"]}, {"inputs": ["def"], "params": {"max_new_tokens": 2, "temperature": 0.7}}):
        response = app.post("/invocations", json=body)
        assert response.status_code == 200, response.text
        assert isinstance(response.json()["predictions"][0], str)
    response = app.post("/invocations", json={"inputs": ["def"], "params": {"max_new_tokens": "many"}})
    assert response.status_code == 400 and "max_new_tokens" in response.text


@pytest.mark.e2e  # MLflow's loading and scoring code on a registered export: seconds of the quick tier's budget
def test_a_registered_version_whose_files_are_gone_is_registered_again(stage, caplog):
    import shutil

    config, args = stage
    first = export_flow(**args)
    client = MlflowClient(tracking_uri=default_tracking_uri(config))
    files = client.get_model_version_download_uri("gpt2-smoke", str(first["model_version"]))
    shutil.rmtree(storage.local_path(files))
    with caplog.at_level(logging.WARNING, logger="tasks.registry"):
        again = export_flow(**args)
    assert again["model_version"] == first["model_version"] + 1
    assert f"registered model gpt2-smoke version {first['model_version']} has no files left" in caplog.text
    assert int(client.get_model_version_by_alias("gpt2-smoke", "current").version) == again["model_version"]


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
    # Named for what it is (#64 item 8; it said "is not writable", which sends one to permissions).
    assert out.exit_code == 1 and f"lies under a file ({blocker}), not a folder" in out.stderr
    assert blocker.read_text() == "x"
    assert not storage.exists(storage.join(layout.run_dir(config), "export"))


def flip_one_byte(path) -> None:
    """Damage a file without changing its size (what a bad disk or a botched copy does)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_export_file_is_named_and_not_registered(stage):
    """An export interrupted before its registration, whose weights were then
    damaged (same size): `gpt2 export` names the file instead of registering it."""
    from gpt2.checkpoint.ref import resolve_checkpoint
    from gpt2.export import writer

    config, _ = stage
    exported = writer.export_checkpoint(resolve_checkpoint(config, "latest"), config.runtime.root)
    flip_one_byte(storage.local_path(storage.join(exported.hf_dir, "model.safetensors")))
    out = CliRunner().invoke(app, ["export", "--root", config.runtime.root,
                                   "--set", f"runtime.work_dir={config.runtime.work_dir}"])
    assert out.exit_code == 1, out.output
    assert f"export file {exported.hf_dir}/model.safetensors does not match its manifest.json" in out.stderr
    assert f"remove {exported.export_dir} and run the export again" in out.stderr
    assert MlflowClient(tracking_uri=default_tracking_uri(config)).search_model_versions("name = 'gpt2-smoke'") == []


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
