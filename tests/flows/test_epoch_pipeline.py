"""`train.max_steps=epoch` through the parent flow in-process: the data stage
writes the split, the parent pins one epoch's steps for the other stages, the
trainer runs exactly that many, and evaluate and export given `epoch` on
their own find the same run."""

from __future__ import annotations

import mlflow
import pytest

from flows.evaluate import eval_flow
from flows.export import export_flow
from flows.pipeline import pipeline_flow
from gpt2.config.overrides import resolve_config
from gpt2.data.manifest import load_manifest
from gpt2.root import layout
from gpt2.tracking.store import default_tracking_uri
from tests.tiers import scenario


@scenario  # the whole pipeline with an epoch-long run, then evaluate and export; its trainer warm
def test_one_epoch_of_the_prepared_split(prefect_server, tmp_path):
    root, work = tmp_path / "root", tmp_path / "work"
    # A small split (about 10 steps of 1,024 tokens) keeps the run short. (A smaller one would not:
    # under twice data.val_tokens, the data stage shrinks the val split to a tenth and trains on the rest.)
    overrides = {"runtime.root": str(root), "runtime.work_dir": str(work), "train.max_steps": "epoch",
                 "data.max_tokens": 8192 + 10_500, "train.total_batch_tokens": 1024, "train.micro_batch_size": 8}
    result = pipeline_flow("smoke", overrides)

    config = resolve_config("smoke", overrides)
    train_tokens = load_manifest(layout.manifest(config)).split_tokens("train")
    steps = train_tokens // config.train.total_batch_tokens
    assert 5 <= steps <= 12, train_tokens
    assert result["checkpoint"].endswith(f"/checkpoints/{layout.step_name(steps)}")

    # MLflow shows the number, on the training run and on the pipeline's run.
    client = mlflow.MlflowClient(default_tracking_uri(config))
    train_run = client.get_run(result["stage_mlflow_run_ids"]["train"])
    assert train_run.data.params["train.max_steps"] == str(steps)
    assert client.get_run(result["mlflow_run_id"]).data.params["train.max_steps"] == str(steps)

    # The stage flows resolve `epoch` by themselves to the same run: cached, same checkpoint.
    args = dict(preset="smoke", overrides=overrides)
    evaluated = eval_flow(**args)
    assert evaluated["cached"] and evaluated["checkpoint"] == result["checkpoint"]
    exported = export_flow(**args)
    assert exported["cached"] and exported["hf_dir"] == result["hf_dir"]
