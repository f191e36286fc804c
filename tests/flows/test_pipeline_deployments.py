"""The whole architecture on loopback: `gpt2 stack up` (Prefect server, MLflow
server, a cpu and a gpu process worker), then `prefect deployment run
gpt2/full-pipeline`:

1. the smoke pipeline, its training process SIGKILLed mid-training, the gpu
   worker's own report of the crash held back until the rescheduled attempt runs
   (as a busy machine holds it; it must not crash that attempt): the
   automation reschedules it, it resumes from its checkpoint, the parent waits
   and completes, every stage on its pool's deployment, MLflow has one training
   run whose steps continue, plus evaluation, export and a registered model
   version (until #59 the plain first run and the killed one were two
   pipelines: the killed one checks all the first did, ~60 s of the tier);
2. a repeat of the first run completes with every data task Cached.

The SIGTERM and parent-death paths are in test_pipeline_preemption.py. Each module on the
pytest worker's shared stack (tests/flows/conftest.py), on a root of its own.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.flows.pipeline_stack import (
    PIPELINE_TIMEOUT_S,
    assert_completed,
    child,
    client,
    crash_report_held,
    deployment_run,
    flow_run_process,
    overrides,
    pipeline_completed,
    wait_attempt_running,
    wait_checkpoint,
    wait_final,
)
from tests.tiers import STACK_A

# One pytest worker's stack for this module and the other modules of STACK_A (tests/tiers.py).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(STACK_A)]


def test_first_run_its_training_killed_is_rescheduled_resumes_and_completes_on_the_pools(stack):
    from mlflow import MlflowClient

    from flows.stages import results_url
    from gpt2.config.overrides import resolve_config

    params = overrides(stack)  # the first run on this root: its data stage does the work
    config = resolve_config("smoke", params)
    parent_id = deployment_run(stack, params)
    train = child(stack, parent_id, "gpt2-train/train", timeout=PIPELINE_TIMEOUT_S)
    proc = flow_run_process(stack, str(train.id), timeout=PIPELINE_TIMEOUT_S)
    killed_after = wait_checkpoint(config, proc, timeout=PIPELINE_TIMEOUT_S)
    assert killed_after < config.train.max_steps
    os.kill(proc.pid, signal.SIGKILL)
    # The worker's own report of the crash held back until the rescheduled attempt runs, as a busy
    # machine holds it (a late report crashed that attempt: one GPU start wasted; cli.stack.worker).
    with crash_report_held(stack):
        wait_attempt_running(stack, train.id, 2)

    train, history = pipeline_completed(stack, parent_id, train.id, "after a killed training run")
    pools = {}
    for dep in ("gpt2-data/data", "gpt2-train/train", "gpt2-eval/evaluate", "gpt2-export/export"):
        run = child(stack, parent_id, dep)
        assert_completed(stack, run, dep)
        pools[dep] = run.work_pool_name
    assert pools == {"gpt2-data/data": "cpu", "gpt2-train/train": "gpu", "gpt2-eval/evaluate": "gpu",
                     "gpt2-export/export": "cpu"}
    assert train.run_count == 2 and history.count("Crashed") == 1 and "AwaitingRetry" in history, history
    # The server's log says which trigger took up the crash (cli.stack.server_logging).
    server_log = (Path(stack["state_dir"]) / "logs" / "server.log").read_text()
    assert any("covers event 'prefect.flow-run.Crashed'" in line and str(train.id) in line
               for line in server_log.splitlines()), server_log[-3000:]
    from gpt2.root import storage

    result = storage.read_json(results_url(config, str(train.id)))
    resumed = result["resumed_from_step"]
    assert killed_after <= resumed < config.train.max_steps  # from a checkpoint, not from step 0

    mlflow = MlflowClient(tracking_uri=stack["mlflow_url"])
    experiment = mlflow.get_experiment_by_name(config.tracking.experiment).experiment_id
    of_train = f"tags.`prefect.flow_run_id` = '{train.id}'"
    runs = mlflow.search_runs(experiment_ids=[experiment], filter_string=f"{of_train} and tags.stage = 'train'")
    assert len(runs) == 1, "one training run, reopened after the reschedule"
    # Each attempt on the gpu pool checked its machine first (train.preflight), and passed.
    checked = mlflow.search_runs(experiment_ids=[experiment], filter_string=f"{of_train} and tags.stage = 'preflight'")
    assert checked and all(r.info.status == "FINISHED" for r in checked)
    losses = mlflow.get_metric_history(runs[0].info.run_id, "train/loss")
    steps = [m.step for m in losses]
    # One curve that continues: step 1 logged once (no restart), every step after the
    # resume logged. Points still queued for MLflow when the process was killed are lost.
    assert steps.count(1) == 1 and max(steps) == config.train.max_steps
    assert set(range(resumed + 1, config.train.max_steps + 1)) <= set(steps)
    stage_runs = {s: child(stack, parent_id, d) for s, d in (("evaluate", "gpt2-eval/evaluate"),
                                                              ("export", "gpt2-export/export"))}
    found = {}
    for stage, run in stage_runs.items():
        found[stage] = mlflow.search_runs(experiment_ids=[runs[0].info.experiment_id],
                                          filter_string=f"tags.`prefect.flow_run_id` = '{run.id}'")
        assert len(found[stage]) == 1 and found[stage][0].data.tags.get("stage") == stage
    versions = mlflow.search_model_versions(f"name = '{config.export.registered_model}'")
    assert any(v.run_id == found["export"][0].info.run_id for v in versions)
    stack["first"] = parent_id  # a repeat of a run that passed every check


def test_repeat_of_the_first_run_finds_every_data_task_cached(stack):
    from mlflow import MlflowClient
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.stages import results_url
    from gpt2.config.overrides import resolve_config
    from gpt2.root import storage

    assert "first" in stack, "needs test_first_run_its_training_killed_is_rescheduled_resumes_and_completes_on_the_pools"
    config = resolve_config("smoke", overrides(stack))
    mlflow = MlflowClient(tracking_uri=stack["mlflow_url"])
    experiment = mlflow.get_experiment_by_name(config.tracking.experiment).experiment_id

    def stage_runs() -> dict[str, int]:
        tags = [run.data.tags.get("stage") for run in mlflow.search_runs([experiment], max_results=5000)]
        return {stage: tags.count(stage) for stage in ("data", "train", "evaluate", "export")}

    before = (stage_runs(), len(mlflow.search_model_versions(f"name = '{config.export.registered_model}'")))
    parent = wait_final(stack, deployment_run(stack, overrides(stack)))
    assert_completed(stack, parent, "the repeated pipeline")
    data = child(stack, str(parent.id), "gpt2-data/data")
    with client(stack) as c:
        tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[data.id])))
    names = {t.name.rsplit("-", 1)[0]: t.state.name for t in tasks}
    assert names == {"download": "Cached", "tokenize": "Cached", "shard": "Cached", "upload": "Cached"}, names
    # #33 item 7: a cached stage is cached end to end: every stage answers from its cache, and
    # none adds an MLflow run or registers the unchanged checkpoint again.
    for dep in ("gpt2-data/data", "gpt2-train/train", "gpt2-eval/evaluate", "gpt2-export/export"):
        run = child(stack, str(parent.id), dep)
        assert storage.read_json(results_url(config, str(run.id)))["cached"] is True, dep
    after = (stage_runs(), len(mlflow.search_model_versions(f"name = '{config.export.registered_model}'")))
    assert after == before
