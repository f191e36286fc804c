"""The `gpt2-train` stage flow: real Prefect server, real MLflow (SQLite under
the tmp root), in-process and torchrun (2 gloo workers)."""

from __future__ import annotations

import time

import pytest
from prefect.client.orchestration import get_client

from flows.train import train_flow
from gpt2.checkpoint import store
from tests.gpt2.train.fixtures import TINY, tiny_config, write_dataset
from tests.tiers import scenario

KEYS = {"run_name", "checkpoint", "steps", "resumed_from_step", "final_train_loss", "final_val_loss",
        "tokens_per_second", "mlflow_run_id"}


@pytest.fixture
def stage(tmp_path, prefect_server):
    overrides = {**TINY, "runtime.work_dir": str(tmp_path / "work")}
    root = str(tmp_path / "root")
    config = tiny_config(tmp_path / "root", **{"runtime.work_dir": str(tmp_path / "work")})
    write_dataset(config)
    return config, dict(preset="smoke", overrides=overrides, root=root)


def progress_artifacts() -> list:
    with get_client(sync_client=True) as client:
        return [a for a in client.read_artifacts() if a.type == "progress"]


def test_flow_trains_then_is_cached_and_fresh_starts_over(stage):
    config, args = stage
    before = len(progress_artifacts())
    first = train_flow(**args)
    assert KEYS <= set(first) and first["steps"] == 8 and not first["cached"]
    assert first["checkpoint"] == store.latest_checkpoint(config)
    done = progress_artifacts()
    assert len(done) == before + 1 and max(a.data for a in done) == 100.0

    again = train_flow(**args)
    assert again["cached"] and again["final_val_loss"] == first["final_val_loss"]

    fresh = train_flow(**args, fresh=True)
    assert not fresh["cached"] and fresh["resumed_from_step"] == 0
    assert fresh["final_val_loss"] == first["final_val_loss"]


@scenario
def test_several_processes_run_under_torchrun(stage):
    config, args = stage
    args["overrides"] = {**args["overrides"], "runtime.nproc_per_node": 2, "train.max_steps": 4}
    state = train_flow(**args, return_state=True)
    result = state.result()
    assert result["world_size"] == 2 and result["steps"] == 4
    assert result["checkpoint"].endswith("step_000004")
    # The workers' lines reached the flow's logs (and so the Prefect UI).
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    query = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
    deadline, messages = time.monotonic() + 30, ""
    while "step 4/4" not in messages and time.monotonic() < deadline:  # logs are shipped in batches
        time.sleep(0.5)
        with get_client(sync_client=True) as client:
            messages = "\n".join(log.message for log in client.read_logs(query))
    assert "torch.distributed.run" in messages and "step 4/4" in messages and "[rank 0]" in messages


@scenario
def test_fresh_never_deletes_what_a_live_trainer_holds(stage):
    from gpt2.checkpoint.lease import Lease, LeaseHeld
    from gpt2.root import layout

    config, args = stage
    first = train_flow(**args)
    other = Lease(layout.lease_dir(layout.run_dir(config)), ttl_s=600, flow_run_id="another-run").acquire()
    try:
        with pytest.raises(LeaseHeld, match="flow run another-run"):
            train_flow(**args, fresh=True)
    finally:
        other.release()
    assert store.latest_checkpoint(config) == first["checkpoint"]  # nothing deleted


def _flip_a_byte(checkpoint: str, name: str = "model.safetensors") -> None:
    from gpt2.root import storage

    path = storage.local_path(storage.join(checkpoint, name))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size: only the sha256 in the marker tells
    path.write_bytes(bytes(data))


def test_a_rerun_over_damaged_final_weights_retrains_them_instead_of_answering_cached(stage):
    config, args = stage
    first = train_flow(**args)
    _flip_a_byte(first["checkpoint"])
    with pytest.raises(store.CheckpointError):
        store.verify_checkpoint(first["checkpoint"])  # what evaluate and export would refuse

    again = train_flow(**args)
    assert not again["cached"] and again["resumed_from_step"] < first["steps"] == again["steps"]
    assert again["checkpoint"] == first["checkpoint"]
    store.verify_checkpoint(again["checkpoint"])  # repaired: the same step, rewritten
    assert again["final_val_loss"] == first["final_val_loss"]

    # Nothing left that verifies: the rerun fails naming the damage, never "cached".
    for url in store.complete_checkpoints(config):
        _flip_a_byte(url)
    with pytest.raises(Exception, match="verifies"):
        train_flow(**args)
