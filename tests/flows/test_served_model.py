"""The registered model as `mlflow models serve` serves it: MLflow's own
command in its own process, asked over HTTP as users ask it (end-to-end tier:
the server takes ~20 s to load transformers and the model)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import requests
import torch

from flows.export import export_flow
from gpt2.checkpoint.store import save_checkpoint
from gpt2.model import GPT
from gpt2.root import layout
from gpt2.tracking.store import default_tracking_uri
from tests.conftest import _free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def served(smoke_config, prefect_server, tmp_path):
    """`mlflow models serve -m models:/gpt2-smoke@current --env-manager local` on a free port."""
    config = smoke_config()
    torch.manual_seed(0)
    model = GPT(config.model)
    save_checkpoint(layout.checkpoint_dir(layout.run_dir(config), 20), model, torch.optim.AdamW(model.parameters()),
                    {"step": 20, "config": config.model_dump(mode="json")}, {})
    export_flow(preset="smoke", overrides={"runtime.work_dir": config.runtime.work_dir}, root=config.runtime.root)
    port = _free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": default_tracking_uri(config)}
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/gpt2-smoke@current",
                               "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, server, tmp_path / "serve.log")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _wait_until_up(url: str, server: subprocess.Popen, log_path, seconds: float = 180) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow models serve exited with {server.returncode}: {log_path.read_text()[-2000:]}")
        try:
            if requests.get(f"{url}/ping", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(1)
    pytest.fail(f"mlflow models serve did not answer /ping in {seconds} s: {log_path.read_text()[-2000:]}")


def test_mlflow_models_serve_answers_json_with_and_without_params(served):
    for body in ({"inputs": ["def"]},
                 {"inputs": ["def", "class"], "params": {"max_new_tokens": 3, "do_sample": False}}):
        response = requests.post(f"{served}/invocations", json=body, timeout=120)
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        assert len(predictions) == len(body["inputs"]) and all(isinstance(p, str) for p in predictions)
