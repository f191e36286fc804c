"""MLflow runs made the way the stages make them, for the runs-report tests: a
training run through gpt2.tracking.tracker.Tracker with the trainer's name, tag and
params (the config, flattened), and an evaluate run through
tasks.tracking.stage_run with the evaluate task's name and checkpoint tags."""

from __future__ import annotations

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.config.tree import Config
from gpt2.root import layout
from gpt2.tracking.store import default_tracking_uri
from gpt2.tracking.tracker import Tracker
from tasks.tracking import checkpoint_tags, stage_run


def training_run(config: Config, metrics: dict[str, list[tuple[int, float]]], run_id: str | None = None) -> str:
    """A training run of `config` that logged `metrics` ({name: [(step, value)]});
    with `run_id`, that run reopened, as a resumed trainer does."""
    with Tracker(config, layout.run_name(config), run_id=run_id, tags={"stage": "train"}) as tracker:
        if run_id is None:
            tracker.log_params(config.model_dump(mode="json"))
        for name, points in metrics.items():
            for step, value in points:
                tracker.log_metrics({name: value}, step=step)
    return tracker.run_id


def logged_again(config: Config, run_id: str, metrics: dict[str, list[tuple[int, float]]]) -> None:
    """Points written into `run_id` at steps it already holds, as a run holds
    them after a rollback redid its steps, or one logged before a resumed
    tracker skipped the steps its run holds (gpt2.tracking)."""
    import time

    from mlflow import MlflowClient
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    MlflowClient(default_tracking_uri(config)).log_batch(run_id, metrics=[
        Metric(name, value, now, step) for name, points in metrics.items() for step, value in points])


def evaluate_run(config: Config, step: int, acc_norm: float, stderr: float | None = None) -> str:
    """The evaluate stage's run for the checkpoint of `config`'s run at `step`
    (with lm-eval's acc_norm_stderr when given, as the stage logs it)."""
    ref = CheckpointRef(layout.checkpoint_dir(layout.run_dir(config), step), step, "0" * 64)
    metrics = {"hellaswag/acc": acc_norm - 0.02, "hellaswag/acc_norm": acc_norm}
    metrics.update({"hellaswag/acc_norm_stderr": stderr} if stderr is not None else {})
    with stage_run(config, f"eval-{ref.run_name}-{ref.step_name}", "evaluate", tags=checkpoint_tags(ref)) as tracker:
        tracker.log_metrics(metrics, step=step)
    return tracker.run_id
