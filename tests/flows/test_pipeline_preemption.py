"""Preemption on the local stack, each as a spot VM or a pod delivers it:

1. SIGTERM (a spot reclaim with notice) to the data stage's flow-run process
   mid-run, then to the training flow run's: each run ends Crashed (never
   Failed) and is rescheduled; the data stage continues from its cache, the
   trainer checkpoints and resumes from the SIGTERM checkpoint; then, while the
   resumed training runs, the parent's own process is killed (its CPU machine
   went away): rescheduled, it re-attaches to the training run it started (no
   second one) and completes (until #59 a pipeline of its own, ~60 s of the tier);
2. the same through `prefect flow-run execute` with
   PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=reschedule (what a Kubernetes pod
   runs as PID 1): the run goes back to Scheduled and resumes.

On the pytest worker's shared stack (tests/flows/conftest.py), on a root of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.stack.fixtures import gpt2
from tests.flows.pipeline_stack import (
    PIPELINE_TIMEOUT_S,
    assert_completed,
    checkpoint_step,
    child,
    client,
    deployment_run,
    flow_run_process,
    gpu_pool_paused,
    layout_run_dir,
    overrides,
    pipeline_completed,
    wait_settled,
)
from tests.tiers import STACK_B

# One pytest worker's stack for this module and the other modules of STACK_B (tests/tiers.py).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(STACK_B)]


# Long enough that a SIGTERM lands mid-training (it is sent a second after the
# lease is taken, a handful of steps in; 600 and then 200 steps cost these tests
# minutes of training and proved nothing more: a step is ~0.2 s of CPU); only SIGTERM and the end
# write a checkpoint, so the resume point proves which one. A quarter of the
# smoke step's tokens (two micro-batches still: accumulation is exercised) and
# no in-loop HellaSwag: the steps are cheap, and the time goes to what these
# tests are about (the signal, the reschedule, the resume), not to training.
LONG_RUN = {"train.max_steps": 60, "train.checkpoint_every": 10_000, "train.eval_every": 10_000,
            "train.sample_every": 10_000, "train.total_batch_tokens": 256, "train.micro_batch_size": 2,
            "eval.every_steps": 0}


def sigterm_while_running(stack, run, unfinished) -> None:
    """SIGTERM to a flow run's process mid-work: the process is frozen first, then signalled only
    while its work has not ended (`unfinished()`, read from what the work writes last). Not the
    server's word: a run it still has as Running may have returned and be proposing Completed (seen
    once: a data stage ended Completed, the signal swallowed), and its task runs' states reach it
    through events, late (a data stage once ended whole between two looks at them)."""
    proc = flow_run_process(stack, str(run.id), timeout=PIPELINE_TIMEOUT_S)
    proc.suspend()
    try:
        with client(stack) as c:
            state = c.read_flow_run(run.id).state
        assert state.is_running(), f"{run.name} was {state.name} before the SIGTERM could land"
        assert unfinished(), f"{run.name} had finished its work before the SIGTERM could land"
        proc.send_signal(signal.SIGTERM)
    finally:
        proc.resume()
    proc.wait(timeout=120)


def test_sigterm_to_data_then_training_reschedules_each_and_training_resumes_from_its_checkpoint(stack):
    """The first test of this module's stack: its data stage does the work (no cache yet)."""
    from flows.stages import results_url
    from gpt2.config.overrides import resolve_config
    from gpt2.root import layout, storage

    params = overrides(stack, **{"train.lr": 2e-3, **LONG_RUN})
    config = resolve_config("smoke", params)
    parent_id = deployment_run(stack, params)
    # The fault soak's defect: a cpu stage was not rescheduled, and its pipeline failed on it.
    data = child(stack, parent_id, "gpt2-data/data", timeout=PIPELINE_TIMEOUT_S)
    # The manifest is the data stage's last write: absent, the stage is mid-work.
    sigterm_while_running(stack, data, lambda: not storage.exists(layout.manifest(config)))
    train = child(stack, parent_id, "gpt2-train/train", timeout=PIPELINE_TIMEOUT_S)
    proc = flow_run_process(stack, str(train.id), timeout=PIPELINE_TIMEOUT_S)
    with client(stack) as c:
        first_attempt = c.read_flow_run(train.id).infrastructure_pid
    run_dir = storage.local_path(layout_run_dir(config))
    deadline = time.monotonic() + PIPELINE_TIMEOUT_S
    while not (run_dir / "lease").exists():  # training has started (its lease is taken)
        assert time.monotonic() < deadline and proc.is_running(), "training never started"
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    stopped_at = checkpoint_step(config)
    assert stopped_at is not None and stopped_at < config.train.max_steps, "no SIGTERM checkpoint"

    # The parent's own machine goes away while the rescheduled training runs.
    _next_attempt_running(stack, train.id, first_attempt)
    os.kill(flow_run_process(stack, parent_id, timeout=60).pid, signal.SIGKILL)
    parent = wait_settled(stack, parent_id)
    assert_completed(stack, parent, "the pipeline after a SIGTERM to each stage and its own process's death")
    with client(stack) as c:
        parent_history = [s.name for s in c.read_flow_run_states(parent_id)]
    assert parent.run_count >= 2 and "Crashed" in parent_history, parent_history
    child(stack, parent_id, "gpt2-train/train")  # exactly one training run for this parent
    assert checkpoint_step(config) == config.train.max_steps

    train, history = pipeline_completed(stack, parent_id, train.id, "after a SIGTERM")
    assert train.run_count >= 2 and "Crashed" in history and "Failed" not in history, history
    result = storage.read_json(results_url(config, str(train.id)))
    assert result["resumed_from_step"] == stopped_at
    with client(stack) as c:
        data = c.read_flow_run(data.id)
        data_history = [s.name for s in c.read_flow_run_states(data.id)]
    assert_completed(stack, data, "the data stage")
    assert data.run_count >= 2 and "Crashed" in data_history and "AwaitingRetry" in data_history, data_history
    assert "Failed" not in data_history, data_history


def test_sigterm_under_flow_run_execute_reschedules(stack):
    """What the Kubernetes worker runs as the pod's PID 1, here by hand."""
    from prefect.states import Scheduled

    from gpt2.config.overrides import resolve_config

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
    from gpt2.root import storage

    # The pod's environment: the reschedule behaviour, where the image keeps the code, and the
    # heartbeat the gpu pools' job templates give their pods (deployments/pools/kubernetes-gpu.json).
    # Without it Prefect beats every 180 s, and a run past the zombie automation's 90 s after its
    # first beat is marked Crashed under the test (seen when the resumed run took 5 minutes).
    env = {**stack["env"], "PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR": "reschedule",
           deployment_file.PROJECT_DIR_ENV: str(deployment_file.PROJECT_DIR),
           deployment_file.HEARTBEAT_ENV: str(deployment_file.GPU_HEARTBEAT_S)}

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
    stopped_at = checkpoint_step(config)
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


def _next_attempt_running(stack, run_id, stopped: str) -> None:
    """Until the run's next attempt runs in a process other than `stopped` (the infrastructure pid
    the server recorded for the attempt that was stopped)."""
    deadline = time.monotonic() + PIPELINE_TIMEOUT_S
    while True:
        with client(stack) as c:
            run = c.read_flow_run(run_id)
        if run.state.is_running() and run.infrastructure_pid and run.infrastructure_pid != stopped:
            return
        assert not run.state.is_completed() and time.monotonic() < deadline, (
            f"the training run was {run.state.name} before its next attempt could be seen running")
        time.sleep(0.5)
