"""An fp16 run with its loss scaler (train.precision=fp16, on the CPU) as a real
process: SIGKILLed between checkpoints and rerun, it ends exactly like an
uninterrupted fp16 run, the scaler's state included (state.json's loss_scaler)."""

from __future__ import annotations

import pytest
import torch

from gpt2.checkpoint import store
from gpt2.root import layout, storage
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.test_train import weights
from tests.gpt2.train.test_train_process import launch, run_to_end, sigkill, wait_for
from tests.tiers import SCENARIO

pytestmark = [*SCENARIO, pytest.mark.xdist_group("precision_process")]

FP16 = {"train.precision": "fp16"}


def _scaler(checkpoint: str) -> dict:
    return storage.read_json(storage.join(checkpoint, "state.json"))["loss_scaler"]


def test_fp16_sigkill_then_rerun_ends_exactly_like_an_uninterrupted_run_scaler_included(tmp_path):
    ref_config = tiny_config(tmp_path / "reference", **FP16)
    write_dataset(ref_config)
    ref = run_to_end(ref_config, tmp_path / "reference")
    assert ref["precision"] == "fp16"

    config = tiny_config(tmp_path / "killed", **FP16)
    write_dataset(config)
    run_dir = layout.run_dir(config)
    proc, lines = launch(config, tmp_path / "killed"), []
    wait_for(proc, "step_000002 written", lines)
    sigkill(proc, run_dir)
    assert store.latest_checkpoint(config).endswith(("step_000002", "step_000004"))
    assert _scaler(store.latest_checkpoint(config)) is not None

    result = run_to_end(config, tmp_path / "killed")
    assert result["resumed_from_step"] >= 2 and result["steps"] == 8
    assert result["final_train_loss"] == ref["final_train_loss"]
    assert result["final_val_loss"] == ref["final_val_loss"]
    assert result["skipped_steps"] == ref["skipped_steps"]
    assert _scaler(result["checkpoint"]) == _scaler(ref["checkpoint"])
    ours, theirs = weights(result["checkpoint"]), weights(ref["checkpoint"])
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
