"""The training flow runs `gpt2 preflight` first (train.preflight): a machine or
root that cannot finish the run fails the flow in its first minutes, naming the
failed check, in the flow's error and in MLflow, and is not retried; a good one
trains, with the preflight's figures in MLflow beside the training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.train import train_flow
from gpt2.preflight.child import IN_FLOW_STEPS
from gpt2.root import layout, storage
from gpt2.tracking.store import default_tracking_uri
from tests.gpt2.train.fixtures import TINY, tiny_config, write_dataset
from tests.tiers import SCENARIO

pytestmark = SCENARIO  # a child process per flow run (the preflight), then the trainer: the end-to-end tier


@pytest.fixture
def stage(tmp_path, prefect_server):
    overrides = {**TINY, "runtime.work_dir": str(tmp_path / "work"), "train.preflight": True, "train.max_steps": 2,
                 "train.checkpoint_every": 2, "train.eval_every": 2, "train.sample_every": 2}
    config = tiny_config(tmp_path / "root", **overrides)
    write_dataset(config)
    return config, dict(preset="smoke", overrides=overrides, root=str(tmp_path / "root"))


def preflight_runs(config) -> list:
    client = MlflowClient(default_tracking_uri(config))
    exp = client.get_experiment_by_name(config.tracking.experiment)
    return client.search_runs([exp.experiment_id], "tags.stage = 'preflight'") if exp else []


def test_a_good_machine_passes_the_preflight_and_trains_with_its_figures_in_mlflow(stage, tmp_path):
    config, args = stage
    result = train_flow(**args)
    assert result["steps"] == 2 and not result["cached"]
    [run] = preflight_runs(config)
    assert run.info.status == "FINISHED" and run.info.run_name == f"preflight-{layout.run_name(config)}"
    assert run.data.metrics["preflight/tokens_per_second"] > 0 and run.data.metrics["preflight/micro_batch"] == 4
    assert run.data.tags["preflight.failed"] == "none"
    client = MlflowClient(default_tracking_uri(config))
    assert "preflight.json" in [a.path for a in client.list_artifacts(run.info.run_id)]
    saved = Path(client.download_artifacts(run.info.run_id, "preflight.json", str(tmp_path)))
    checks = json.loads(saved.read_text())["checks"]
    assert f"{IN_FLOW_STEPS + 1} full steps ran" in checks["memory"]["detail"]  # the first compiles, 2 timed
    # A cached rerun trains nothing, so it checks nothing either.
    assert train_flow(**args)["cached"] and len(preflight_runs(config)) == 1


def test_a_damaged_shard_fails_the_flow_by_its_name_before_any_attempt_and_is_not_retried(stage):
    config, args = stage
    directory = storage.local_path(layout.data_dir(config))
    path = sorted(directory.glob("*.bin"))[-1]
    name = path.name
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one flipped bit: the size stays, only the sha256 tells
    path.write_bytes(bytes(data))

    state = train_flow(**args, return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception) as err:
        state.result()
    assert name in str(err.value) and "preflight" in str(err.value)
    run_dir = layout.run_dir(config)
    assert storage.list_dir(layout.attempts_dir(run_dir)) == []  # no attempt billed
    assert storage.list_dir(layout.lease_dir(run_dir)) == []  # no lease taken
    [run] = preflight_runs(config)  # one preflight: the task was not retried
    assert run.info.status == "FAILED" and run.data.tags["preflight.failed"] == "data"
