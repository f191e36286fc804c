"""MLflow away while the trainer trains, the trainer SIGKILLed after a
checkpoint, MLflow back, the run resumed: the training run's curves hold every
step once, none missing (the checkpoint keeps the points MLflow never had,
gpt2.train.checkpoint_state's tracking_backlog; the resumed tracker skips the
steps the run already holds). The question the fault soak (bench/soak/run.py)
asks of the MLflow server away for minutes, at the moment that loses most."""

from __future__ import annotations

from mlflow import MlflowClient

from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.test_train_process import finish, launch, run_to_end, sigkill, wait_for
from tests.tiers import SCENARIO

pytestmark = SCENARIO

PER_STEP = ("train/loss", "train/lr", "train/grad_norm")


def test_mlflow_away_then_sigkill_leaves_no_gap_and_no_step_twice(tmp_path):
    from gpt2.root import layout

    blocked = tmp_path / "tracking"
    blocked.write_text("not a directory")  # SQLite cannot open the store: MLflow is away
    config = tiny_config(tmp_path, **{"tracking.uri": f"sqlite:///{blocked}/mlflow.db"})
    write_dataset(config)
    proc, lines = launch(config, tmp_path), []
    wait_for(proc, "step_000004 written", lines)
    sigkill(proc, layout.run_dir(config))
    finish(proc, lines)

    blocked.unlink()
    blocked.mkdir()  # MLflow is back
    result = run_to_end(config, tmp_path)
    assert result["resumed_from_step"] >= 4 and result["mlflow_run_id"]
    client = MlflowClient(config.tracking.uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len([r for r in runs if r.data.tags.get("stage") == "train"]) == 1
    for key in PER_STEP:
        steps = [m.step for m in client.get_metric_history(result["mlflow_run_id"], key)]
        assert steps == list(range(1, 9)), (key, steps)
