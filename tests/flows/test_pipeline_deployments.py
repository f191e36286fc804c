"""The whole architecture on loopback (issue 5's end-to-end test): `gpt2 stack
up` (Prefect server, MLflow server, a cpu and a gpu process worker), then
`prefect deployment run gpt2/full-pipeline`:

1. the smoke pipeline completes, every stage on its pool's deployment;
2. a second pipeline (another training identity) whose training process is
   SIGKILLed mid-training: the automation reschedules it, it resumes from its
   checkpoint, the parent waits and completes, MLflow has one training run
   whose steps continue, plus evaluation, export and a registered model version;
3. the same with SIGTERM (a spot reclaim with notice): the trainer checkpoints,
   the run ends Crashed (never Failed), is rescheduled and resumes from the
   SIGTERM checkpoint; and through `prefect flow-run execute` with
   PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=reschedule (what a Kubernetes
   pod runs), the run goes back to Scheduled and resumes;
4. the parent's own process killed mid-pipeline: rescheduled, it re-attaches and completes;
5. a repeat of the first run completes with every data task Cached.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.cli.stack.fixtures import clean_env, gpt2, last_json

pytestmark = pytest.mark.slow

PIPELINE_TIMEOUT_S = 900  # ~3 min on an idle 2-core machine; CI machines are busier


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("stack")
    env = clean_env(base / "home")
    info = last_json(gpt2(env, base, "stack", "up", "--root", str(base / "root"), "--json"))
    assert info["healthy"], info
    yield {**info, "env": env, "base": base}
    gpt2(env, base, "stack", "down", check=False)


def overrides(stack, **extra) -> dict:
    return {"runtime.root": stack["root"], "runtime.work_dir": str(stack["base"] / "work"), **extra}


def deployment_run(stack, params: dict) -> str:
    """`prefect deployment run gpt2/full-pipeline` as a user types it; returns the flow run id."""
    args = ["deployment", "run", "gpt2/full-pipeline", "--param", "preset=smoke",
            "--param", f"overrides={json.dumps(params)}"]
    done = subprocess.run([sys.executable, "-m", "prefect", *args], env=stack["env"], cwd=stack["base"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"UUID: ([0-9a-f-]{36})", done.stdout).group(1)


def client(stack):
    from cli.stack.prefect_setup import client as stack_client

    # The stack's server answers only requests that carry its auth string.
    return stack_client(stack["prefect_api_url"], Path(stack["prefect_auth_file"]).read_text().strip())


def wait_final(stack, run_id: str, timeout: float = PIPELINE_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with client(stack) as c:
            run = c.read_flow_run(run_id)
        if run.state.is_final():
            return run
        time.sleep(3)
    raise AssertionError(f"flow run {run_id} still {run.state.name} after {timeout:.0f} s; "
                         f"logs in {stack['state_dir']}/logs")


def wait_settled(stack, run_id: str, grace_s: float = 120):
    """Like wait_final, but a Crashed run gets `grace_s` to be rescheduled by
    the automation (which waits 20 s) before it counts as final."""
    while True:
        run = wait_final(stack, run_id)
        if not run.state.is_crashed():
            return run
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            time.sleep(3)
            with client(stack) as c:
                run = c.read_flow_run(run_id)
            if not run.state.is_crashed():
                break
        else:
            return run


def child(stack, parent_id: str, stage_deployment: str, timeout: float = 0):
    """The stage flow run the parent started (its idempotency key names the parent);
    waits up to `timeout` for it, but not past the parent's end."""
    deadline = time.monotonic() + timeout
    while True:
        with client(stack) as c:
            dep = c.read_deployment_by_name(stage_deployment)
            runs = [r for r in c.read_flow_runs(limit=200) if r.deployment_id == dep.id
                    and (r.idempotency_key or "").startswith(parent_id)]
            parent = c.read_flow_run(parent_id)
        if runs or time.monotonic() >= deadline or parent.state.is_final():
            assert len(runs) == 1, (f"{len(runs)} runs of {stage_deployment} for parent {parent_id}, "
                                    f"which is {parent.state.name}: {parent.state.message}")
            return runs[0]
        time.sleep(1)


def assert_completed(stack, run, what: str) -> None:
    assert run.state.is_completed(), (
        f"{what} ended {run.state.name}: {run.state.message}; logs in {stack['state_dir']}/logs")


def test_first_run_completes_on_the_pools(stack):
    parent = wait_final(stack, deployment_run(stack, overrides(stack)))
    assert_completed(stack, parent, "the pipeline")
    pools = {}
    for dep in ("gpt2-data/data", "gpt2-train/train", "gpt2-eval/evaluate", "gpt2-export/export"):
        run = child(stack, str(parent.id), dep)
        assert_completed(stack, run, dep)
        pools[dep] = run.work_pool_name
    assert pools == {"gpt2-data/data": "cpu", "gpt2-train/train": "gpu", "gpt2-eval/evaluate": "gpu",
                     "gpt2-export/export": "cpu"}
    stack["first"] = str(parent.id)


def _flow_run_process(stack, run_id: str, timeout: float) -> psutil.Process:
    """The flow-run process a worker started for this run (its recorded infrastructure pid)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with client(stack) as c:
            run = c.read_flow_run(run_id)
        assert not run.state.is_final(), f"flow run ended {run.state.name} before it could be killed"
        if run.state.is_running() and run.infrastructure_pid:
            proc = psutil.Process(int(run.infrastructure_pid.rsplit(":", 1)[-1]))  # "[host:]pid"
            assert proc.environ().get("PREFECT__FLOW_RUN_ID") == run_id
            return proc
        time.sleep(0.5)
    raise AssertionError(f"flow run {run_id} never ran")


def _wait_checkpoint(config, proc: psutil.Process, timeout: float) -> int:
    from gpt2.checkpoint import store

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = store.latest_checkpoint(config)
        if latest:
            return int(latest.rsplit("_", 1)[1])
        assert proc.is_running(), "training ended before its first checkpoint"
        time.sleep(0.3)
    raise AssertionError("no checkpoint written")


def pipeline_completed(stack, parent_id: str, train_id, what: str):
    """Wait for the parent; both it and its training run completed. Returns
    the training run and the names of the states it went through."""
    parent = wait_final(stack, parent_id)
    assert_completed(stack, parent, f"the pipeline {what}")
    with client(stack) as c:
        train = c.read_flow_run(train_id)
        history = [s.name for s in c.read_flow_run_states(train_id)]
    assert_completed(stack, train, "the training run")
    return train, history


def test_killed_training_is_rescheduled_and_resumes(stack):
    from mlflow import MlflowClient

    from flows.stages import results_url
    from gpt2.overrides import resolve_config

    params = overrides(stack, **{"train.lr": 1e-3})  # a new training identity: nothing cached
    config = resolve_config("smoke", params)
    parent_id = deployment_run(stack, params)
    train = child(stack, parent_id, "gpt2-train/train", timeout=PIPELINE_TIMEOUT_S)
    proc = _flow_run_process(stack, str(train.id), timeout=PIPELINE_TIMEOUT_S)
    killed_after = _wait_checkpoint(config, proc, timeout=PIPELINE_TIMEOUT_S)
    assert killed_after < config.train.max_steps
    os.kill(proc.pid, signal.SIGKILL)

    train, history = pipeline_completed(stack, parent_id, train.id, "after a killed training run")
    assert train.run_count == 2 and "Crashed" in history and "AwaitingRetry" in history, history
    from gpt2 import storage

    result = storage.read_json(results_url(config, str(train.id)))
    resumed = result["resumed_from_step"]
    assert killed_after <= resumed < config.train.max_steps  # from a checkpoint, not from step 0

    mlflow = MlflowClient(tracking_uri=stack["mlflow_url"])
    runs = mlflow.search_runs(experiment_ids=[mlflow.get_experiment_by_name(config.tracking.experiment).experiment_id],
                              filter_string=f"tags.`prefect.flow_run_id` = '{train.id}'")
    assert len(runs) == 1, "one training run, reopened after the reschedule"
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


# Long enough that a SIGTERM lands mid-training; only SIGTERM and the end
# write a checkpoint, so the resume point proves which one.
LONG_RUN = {"train.max_steps": 600, "train.checkpoint_every": 10_000, "train.eval_every": 10_000,
            "train.sample_every": 10_000}


def _checkpoint_step(config) -> int | None:
    from gpt2.checkpoint import store

    latest = store.latest_checkpoint(config)
    return int(latest.rsplit("_", 1)[1]) if latest else None


def test_sigterm_to_training_reschedules_and_resumes_from_its_checkpoint(stack):
    from flows.stages import results_url
    from gpt2 import storage
    from gpt2.overrides import resolve_config

    params = overrides(stack, **{"train.lr": 2e-3, **LONG_RUN})
    config = resolve_config("smoke", params)
    parent_id = deployment_run(stack, params)
    train = child(stack, parent_id, "gpt2-train/train", timeout=PIPELINE_TIMEOUT_S)
    proc = _flow_run_process(stack, str(train.id), timeout=PIPELINE_TIMEOUT_S)
    run_dir = storage.local_path(layout_run_dir(config))
    deadline = time.monotonic() + PIPELINE_TIMEOUT_S
    while not (run_dir / "lease").exists():  # training has started (its lease is taken)
        assert time.monotonic() < deadline and proc.is_running(), "training never started"
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    stopped_at = _checkpoint_step(config)
    assert stopped_at is not None and stopped_at < config.train.max_steps, "no SIGTERM checkpoint"

    train, history = pipeline_completed(stack, parent_id, train.id, "after a SIGTERM")
    assert train.run_count >= 2 and "Crashed" in history and "Failed" not in history, history
    result = storage.read_json(results_url(config, str(train.id)))
    assert result["resumed_from_step"] == stopped_at


def test_sigterm_under_flow_run_execute_reschedules(stack):
    """What the Kubernetes worker runs as the pod's PID 1, here by hand."""
    from prefect.states import Scheduled

    from gpt2.overrides import resolve_config

    params = overrides(stack, **{"train.lr": 4e-3, **LONG_RUN})
    config = resolve_config("smoke", params)
    # The data first (cached when an earlier test made it): the training stage needs its manifest.
    gpt2(stack["env"], stack["base"], "prepare", "--preset", "smoke", "--set", f"runtime.root={params['runtime.root']}",
         "--set", f"runtime.work_dir={params['runtime.work_dir']}")
    with client(stack) as c, gpu_pool_paused(stack):  # no worker takes the run: we are its pod
        dep = c.read_deployment_by_name("gpt2-train/train")
        run = c.create_flow_run_from_deployment(dep.id, parameters={"preset": "smoke", "overrides": params},
                                                state=Scheduled())
        _execute_sigterm_then_resume(stack, config, run)


def _execute_sigterm_then_resume(stack, config, run) -> None:
    from prefect.client.schemas.objects import StateType

    from flows import deployment_file
    from flows.stages import results_url
    from gpt2 import storage

    # The pod's environment: the reschedule behaviour, and where the image keeps the code.
    env = {**stack["env"], "PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR": "reschedule",
           deployment_file.PROJECT_DIR_ENV: str(deployment_file.PROJECT_DIR)}

    def execute() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "prefect", "flow-run", "execute", str(run.id)], env=env,
                                cwd=stack["base"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    pod = execute()
    lease = storage.local_path(layout_run_dir(config)) / "lease"
    deadline = time.monotonic() + PIPELINE_TIMEOUT_S
    while not lease.exists():
        assert time.monotonic() < deadline and pod.poll() is None, pod.stdout.read() if pod.poll() is not None else ""
        time.sleep(0.2)
    time.sleep(1)
    pod.send_signal(signal.SIGTERM)  # the kubelet's notice
    out, _ = pod.communicate(timeout=180)
    stopped_at = _checkpoint_step(config)
    assert stopped_at is not None and stopped_at < config.train.max_steps, out[-3000:]
    with client(stack) as c:
        state = c.read_flow_run(run.id).state
    assert state.type == StateType.SCHEDULED and state.name == "AwaitingRetry", f"{state.name}: {out[-3000:]}"

    pod = execute()  # the rescheduled pod
    out, _ = pod.communicate(timeout=PIPELINE_TIMEOUT_S)
    with client(stack) as c:
        final = c.read_flow_run(run.id)
    assert_completed(stack, final, "the re-executed training run")
    assert storage.read_json(results_url(config, str(run.id)))["resumed_from_step"] == stopped_at, out[-3000:]


def test_parent_machine_death_is_rescheduled_and_completes(stack):
    """The parent's flow-run process dies (its CPU machine went away) while
    training runs: it is rescheduled, re-attaches to the training run it
    started (no second one), and completes."""
    from gpt2.overrides import resolve_config

    params = overrides(stack, **{"train.lr": 5e-3, **LONG_RUN})
    config = resolve_config("smoke", params)
    parent_id = deployment_run(stack, params)
    train = child(stack, parent_id, "gpt2-train/train", timeout=PIPELINE_TIMEOUT_S)
    _flow_run_process(stack, str(train.id), timeout=PIPELINE_TIMEOUT_S)
    parent_proc = _flow_run_process(stack, parent_id, timeout=60)  # the parent's own flow-run process
    os.kill(parent_proc.pid, signal.SIGKILL)

    parent = wait_settled(stack, parent_id)
    assert_completed(stack, parent, "the pipeline after its own process died")
    with client(stack) as c:
        history = [s.name for s in c.read_flow_run_states(parent_id)]
    assert parent.run_count >= 2 and "Crashed" in history, history
    child(stack, parent_id, "gpt2-train/train")  # exactly one training run for this parent
    assert _checkpoint_step(config) == config.train.max_steps


@contextlib.contextmanager
def gpu_pool_paused(stack):
    from prefect.client.schemas.actions import WorkPoolUpdate

    with client(stack) as c:
        c.update_work_pool("gpu", WorkPoolUpdate(is_paused=True))
    try:
        yield
    finally:
        with client(stack) as c:
            c.update_work_pool("gpu", WorkPoolUpdate(is_paused=False))


def layout_run_dir(config) -> str:
    from gpt2 import layout

    return layout.run_dir(config)


def test_repeat_of_the_first_run_finds_every_data_task_cached(stack):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    assert "first" in stack, "needs test_first_run_completes_on_the_pools"
    parent = wait_final(stack, deployment_run(stack, overrides(stack)))
    assert_completed(stack, parent, "the repeated pipeline")
    data = child(stack, str(parent.id), "gpt2-data/data")
    with client(stack) as c:
        tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[data.id])))
    names = {t.name.rsplit("-", 1)[0]: t.state.name for t in tasks}
    assert names == {"download": "Cached", "tokenize": "Cached", "shard": "Cached", "upload": "Cached"}, names
