"""The parent flow `gpt2` run in-process (what `gpt2 run` does): all four
stages, a parent MLflow run with a child per stage, a fully cached rerun, and
no planted credential anywhere in what the run wrote."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path

import pytest

from tests.cli.read_only_mount import can_mount_read_only, gpt2_read_only, sets, snapshot
from tests.tiers import scenario

FAKE = {
    "HF_TOKEN": "hf_FAKEfakeFAKEfakeFAKEfake12345678",
    "MLFLOW_TRACKING_PASSWORD": "fake-mlflow-password-7788",
    "AWS_SECRET_ACCESS_KEY": "FAKEawsSECRETkey1234567890abcdefXYZ",
}
FAKE_KEY = "FAKEPRIVATEKEYMATERIAL998877665544"


def _files_containing(base: Path, needles: list[str]) -> list[str]:
    hits = []
    for path in base.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path}: {n[:8]}…" for n in needles if n.encode() in data]
    return hits


async def _prefect_records() -> str:
    """Every flow run's parameters, every log line and artifact on the server."""
    from prefect.client.orchestration import get_client

    async def every(read) -> list:
        # The server answers 200 at a time, oldest first; the session's server
        # holds the records of every earlier test too, so read them all.
        found, page = [], None
        while page is None or len(page) == 200:
            page = await read(limit=200, offset=len(found))
            found += page
        return found

    async with get_client() as client:
        runs = await every(client.read_flow_runs)
        logs = await every(client.read_logs)
        artifacts = await every(client.read_artifacts)
    return json.dumps([
        [r.parameters for r in runs],
        [entry.message for entry in logs],
        [a.data for a in artifacts],
    ], default=str)


@pytest.fixture
def planted_secrets(tmp_path, monkeypatch):
    key = tmp_path / "service-account.json"
    key.write_text(json.dumps({"type": "service_account", "private_key":
                               f"-----BEGIN PRIVATE KEY-----{FAKE_KEY}-----END PRIVATE KEY-----"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    for name, value in FAKE.items():
        monkeypatch.setenv(name, value)
    return [*FAKE.values(), FAKE_KEY], key


@scenario  # the whole pipeline, every stage: end to end, in one process (its trainer and preflight warm)
def test_pipeline_in_process(prefect_server, tmp_path, planted_secrets):
    import mlflow

    from flows.pipeline import pipeline_flow
    from gpt2.config.overrides import resolve_config
    from gpt2.root.storage import local_path
    from gpt2.tracking.store import default_tracking_uri

    needles, key_file = planted_secrets
    root, work = tmp_path / "root", tmp_path / "work"
    price, cpu_price = 3.0, 0.5  # runtime settings: they price the bill and never change a cache key
    overrides = {"runtime.root": str(root), "runtime.work_dir": str(work), "runtime.price_per_hour": price,
                 "runtime.cpu_price_per_hour": cpu_price}
    tracking_env = os.environ.get("MLFLOW_TRACKING_URI")
    result = pipeline_flow("smoke", overrides)
    # Registering the model goes through mlflow's global state: it must not
    # leak into the environment that later runs read their tracking URI from.
    assert os.environ.get("MLFLOW_TRACKING_URI") == tracking_env

    assert result["cached_stages"] == []
    assert math.isfinite(result["final_val_loss"])
    assert result["hellaswag"]["n"] > 0 and 0 <= result["hellaswag"]["acc_norm"] <= 1
    assert (local_path(result["hf_dir"]) / "config.json").exists()
    assert local_path(result["llmc_bin"]).exists()
    assert result["registered_model"] == "gpt2-smoke" and result["model_version"] >= 1

    # MLflow: one parent run, the four stage runs are its children.
    client = mlflow.MlflowClient(default_tracking_uri(resolve_config("smoke", overrides)))
    parent = client.get_run(result["mlflow_run_id"])
    assert parent.data.metrics["final_val_loss"] == pytest.approx(result["final_val_loss"])
    for stage, run_id in result["stage_mlflow_run_ids"].items():
        assert run_id, stage
        assert client.get_run(run_id).data.tags.get("mlflow.parentRunId") == parent.info.run_id, stage
    assert result["mlflow_url"].endswith(
        f"/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning")

    # The bill: the training run's on its own MLflow run, the stages added up on the parent's.
    bill = result["bill"]
    assert bill["attempts"] == 1 and bill["steps_redone"] == 0
    assert bill["device_hours"] > 0 and bill["cpu_hours"] > 0
    assert bill["cost"] == pytest.approx(price * bill["device_hours"] + cpu_price * bill["cpu_hours"])
    assert parent.data.metrics["bill/cost"] == pytest.approx(bill["cost"])
    trained = client.get_run(result["stage_mlflow_run_ids"]["train"]).data.metrics
    assert trained["bill/attempts"] == 1 and trained["bill/device_hours"] > 0
    assert trained["bill/cost"] == pytest.approx(price * trained["bill/device_hours"])

    # A rerun does no work: every stage comes back cached, with the same answers.
    again = pipeline_flow("smoke", overrides)
    assert again["cached_stages"] == ["data", "train", "evaluate", "export"]
    assert again["final_val_loss"] == result["final_val_loss"]
    assert again["hf_dir"] == result["hf_dir"]
    assert again["bill"]["attempts"] == 0 and again["bill"]["cost"] == 0  # a cached stage ran nothing

    # The same root read-only (#33 item 6): `gpt2 run` answers the finished
    # pipeline from what the root holds, every stage checked as the flows
    # check a cached result, and writes nothing (no server, lease or MLflow run).
    if can_mount_read_only():
        before = snapshot(root)
        done = gpt2_read_only(root, "run", "--preset", "smoke", "--root", str(root), "--json",
                              *sets({k: v for k, v in overrides.items() if k != "runtime.root"}))
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert answer["read_only"] is True and answer["cached_stages"] == again["cached_stages"]
        for key in ("checkpoint", "final_val_loss", "hellaswag", "hf_dir", "llmc_bin", "registered_model",
                    "model_version", "stage_mlflow_run_ids"):
            assert answer[key] == again[key], key
        assert answer["mlflow_run_id"] is None and answer["bill"]["attempts"] == 0
        assert answer["mlflow_url"].endswith(  # the training run, in the runs view (gpt2.tracking.experiment.ui_link)
            f"/runs/{again['stage_mlflow_run_ids']['train']}?workflowType=machine_learning")
        assert snapshot(root) == before

    # Nothing the runs wrote holds a planted credential: files under the root
    # and work dir (MLflow's database and artifacts included), Prefect's flow
    # run parameters, logs and artifacts.
    assert _files_containing(root, needles) == []
    assert _files_containing(work, needles) == []
    records = asyncio.run(_prefect_records())
    assert records.count("stage") > 0  # the search covers real content
    # The orchestrated run says what it did, as `gpt2 run` does: in its log and as a markdown artifact.
    _, logs, artifacts = json.loads(records)
    said = f"checkpoint:       {result['checkpoint']}"
    assert any(said in line and "pipeline finished (cached stages: none)" in line for line in logs)
    assert any(said in str(data) and "pipeline finished" in str(data) for data in artifacts)
    assert [n for n in needles if n in records] == []
    assert str(key_file) not in records
