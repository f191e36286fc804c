"""A run with rollbacks as real processes: SIGKILLed before, during and after
its rollbacks, then rerun, it ends with the weights of the uninterrupted run;
past train.max_rollbacks the trainer exits as a failure, not a preemption. And
the poisoned data met with detection off, with `warn`, and not at all."""

from __future__ import annotations

import pytest
import torch
from mlflow import MlflowClient

from gpt2.checkpoint import store
from gpt2.launch.torchrun import train_stage
from gpt2.root import layout, storage
from gpt2.tracking.store import default_tracking_uri
from gpt2.train import rollback
from gpt2.train.attempts import read_attempts
from gpt2.train.session import TrainingError
from tests.gpt2.train.fixtures import write_poisoned_dataset
from tests.gpt2.train.test_spikes import POISONED, run, spiky_config
from tests.gpt2.train.test_train import weights
from tests.gpt2.train.test_train_process import launch, run_to_end, sigkill, wait_for
from tests.tiers import SCENARIO

pytestmark = [*SCENARIO, pytest.mark.xdist_group("spikes_process")]


def config_at(root, **more):
    config = spiky_config(root, "rollback", **more)
    write_poisoned_dataset(config, POISONED)
    return config


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    config = config_at(tmp, **{"tracking.enabled": True})  # a runtime setting: the same run as config_at's
    return config, run_to_end(config, tmp)


def test_every_rollback_is_an_mlflow_metric_at_its_step(uninterrupted):
    config, result = uninterrupted
    client = MlflowClient(default_tracking_uri(config))
    history = client.get_metric_history(result["mlflow_run_id"], "spikes/rollback")
    assert [(m.step, m.value) for m in history] == [(14, 12.0), (13, 12.0)]  # at the spike, the step gone back to
    assert {m.step for m in client.get_metric_history(result["mlflow_run_id"], "spikes/grad_norm_z")} == {13, 14}


def test_sigkill_before_during_and_after_the_rollbacks_then_rerun_ends_with_the_same_weights(uninterrupted, tmp_path):
    _, ref = uninterrupted
    assert ref["spikes"]["rollbacks"] == 2
    config = config_at(tmp_path)
    run_dir = layout.run_dir(config)
    every = config.train.checkpoint_every
    back_to = layout.checkpoint_dir(run_dir, POISONED[0] - POISONED[0] % every)  # the checkpoint before the poison

    # Before: the checkpoint to go back to is written, the poisoned batch not yet met.
    proc, lines = launch(config, tmp_path), []
    wait_for(proc, f"{back_to} written", lines)
    sigkill(proc, run_dir)
    # During: the first rollback recorded, the second spike (its record not yet written) still ahead.
    proc, lines = launch(config, tmp_path), []
    wait_for(proc, "rolled back to step", lines)
    sigkill(proc, run_dir)
    assert len(rollback.read_records(back_to)) >= 1
    # After: the rollbacks recorded, no newer checkpoint yet (the next is 4 steps away).
    proc, lines = launch(config, tmp_path), []
    wait_for(proc, "rolled back to step", lines)
    sigkill(proc, run_dir)
    assert [r["rollback"] for r in rollback.read_records(back_to)] == [1, 2]

    result = run_to_end(config, tmp_path)
    assert result["spikes"] == ref["spikes"] and result["final_val_loss"] == ref["final_val_loss"]
    ours, theirs = weights(result["checkpoint"]), weights(ref["checkpoint"])
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    a = storage.read_json(storage.join(result["checkpoint"], store.MARKER))["files"]
    b = storage.read_json(storage.join(ref["checkpoint"], store.MARKER))["files"]
    assert a["optimizer.pt"]["sha256"] == b["optimizer.pt"]["sha256"]
    assert result["bill"]["steps_redone"] >= ref["bill"]["steps_redone"]


def test_past_max_rollbacks_the_trainer_fails_and_is_not_rescheduled(tmp_path):
    config = spiky_config(tmp_path, "rollback", **{"train.max_rollbacks": 1})
    write_poisoned_dataset(config, POISONED)
    # Exit 1 with its error, not 143 (preempted): the training task fails and is not retried (tasks.train).
    with pytest.raises(TrainingError, match=r"exited with code 1: loss spike at step \d+: .*max_rollbacks=1"):
        train_stage(config, isolate=True)


@pytest.fixture(scope="module")
def unnoticed(tmp_path_factory):
    """Detection off on the poisoned data."""
    return run(tmp_path_factory.mktemp("off"), "warn", **{"train.spike_zscore": 0})


def test_with_detection_off_the_poisoned_stretch_goes_unnoticed(unnoticed):
    config, result = unnoticed
    assert result.spikes == {"warned": 0, "skipped": 0, "rollbacks": 0}
    assert not any(a.get("spikes") for a in read_attempts(layout.run_dir(config)))


def test_warn_notices_every_poisoned_step_and_trains_exactly_as_detection_off(unnoticed, tmp_path):
    config, result = run(tmp_path, "warn")
    assert result.spikes == {"warned": 2, "skipped": 0, "rollbacks": 0}
    (attempt,) = read_attempts(layout.run_dir(config))
    assert [(e["step"], e["action"]) for e in attempt["spikes"]] == [(s, "warned") for s in POISONED]
    assert result.run_name == unnoticed[1].run_name  # the same run, by its address
    ours, theirs = weights(result.checkpoint), weights(unnoticed[1].checkpoint)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_the_run_that_rolled_back_ends_near_the_clean_run(uninterrupted, tmp_path):
    _, clean = run(tmp_path, "warn", poisoned=())
    assert clean.spikes == {"warned": 0, "skipped": 0, "rollbacks": 0}  # no false alarm on clean data
    # Three batches fewer of the same phrases, none of the poison: within the runs' spread (measured ~0.01).
    assert abs(uninterrupted[1]["final_val_loss"] - clean.final_val_loss) < 0.03
