"""Which MLflow run a trainer continues (gpt2.train.mlflow_run): the checkpoint's,
else the one recorded under the run; a trainer that lost the run records nothing."""

from __future__ import annotations

from gpt2.root import layout, storage
from gpt2.train import mlflow_run


def test_the_checkpoint_names_the_run_else_the_record_does(tmp_path):
    run_dir = storage.normalize_url(str(tmp_path / "runs" / "r"))
    assert mlflow_run.run_to_reopen(run_dir, {}) is None  # a new training run: a new MLflow run
    mlflow_run.recorder(run_dir, None)("first")
    assert mlflow_run.run_to_reopen(run_dir, {}) == "first"  # died before its first checkpoint
    assert mlflow_run.run_to_reopen(run_dir, {"step": 4, "mlflow_run_id": None}) == "first"  # MLflow away then
    assert mlflow_run.run_to_reopen(run_dir, {"step": 4, "mlflow_run_id": "ckpt"}) == "ckpt"


def test_a_torn_record_opens_a_new_run_instead_of_failing(tmp_path):
    run_dir = storage.normalize_url(str(tmp_path / "runs" / "r"))
    mlflow_run.recorder(run_dir, None)("0123456789abcdef")
    path = storage.local_path(layout.tracking_record(run_dir))
    path.write_bytes(path.read_bytes()[:7])  # cut mid-write
    assert mlflow_run.run_to_reopen(run_dir, {}) is None


def test_a_trainer_that_lost_the_run_records_nothing(tmp_path):
    run_dir = storage.normalize_url(str(tmp_path / "runs" / "r"))
    mlflow_run.recorder(run_dir, lambda: True)("holder")
    mlflow_run.recorder(run_dir, lambda: False)("paused-and-back")  # its lease passed to a later trainer
    assert mlflow_run.run_to_reopen(run_dir, {}) == "holder"
