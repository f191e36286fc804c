"""Driving the local stack's pipelines from the end-to-end tests: start runs as
a user does (`prefect deployment run`), find the processes the workers
started, wait for states and checkpoints. The `stack` fixture itself is in
conftest.py: one stack per pytest worker, each module on a root of its own, so
workers run side by side (pytest -n) each on its own servers, workers and ports."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

PIPELINE_TIMEOUT_S = 900  # ~3 min on an idle 2-core machine; CI machines are busier


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


def _auth(stack) -> str:
    # The stack's server answers only requests that carry its auth string.
    return Path(stack["prefect_auth_file"]).read_text().strip()


def client(stack):
    from cli.stack.prefect_setup import client as stack_client

    return stack_client(stack["prefect_api_url"], _auth(stack))


@contextlib.contextmanager
def _woken_by(stack, run_id: str):
    """The run's events on the stack's server wake the test's waits as they wake the parent's
    (flows.run_events): a run that ended is noticed at once, not at the next 3 s poll."""
    from cli.stack.prefect_setup import server_settings
    from flows.run_events import RunWakeup

    with server_settings(stack["prefect_api_url"], _auth(stack)), RunWakeup(run_id) as wake:
        yield wake


def wait_final(stack, run_id: str, timeout: float = PIPELINE_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    with _woken_by(stack, run_id) as wake:
        while time.monotonic() < deadline:
            with client(stack) as c:
                run = c.read_flow_run(run_id)
            if run.state.is_final():
                return run
            wake.wait(3)
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
        with _woken_by(stack, run_id) as wake:
            while time.monotonic() < deadline:
                wake.wait(3)
                with client(stack) as c:
                    run = c.read_flow_run(run_id)
                if not run.state.is_crashed():
                    break
        if run.state.is_crashed():
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


def flow_run_process(stack, run_id: str, timeout: float) -> psutil.Process:
    """The flow-run process a worker started for this run (its recorded infrastructure pid; where
    that is a warm proxy, the process it stands for: the shared stacks' workers start their flow
    runs from the warm interpreter, tests/flows/conftest.py)."""
    from tests.warm_python import behind

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with client(stack) as c:
            run = c.read_flow_run(run_id)
        assert not run.state.is_final(), f"flow run ended {run.state.name} before it could be killed"
        if run.state.is_running() and run.infrastructure_pid:
            proc = psutil.Process(int(run.infrastructure_pid.rsplit(":", 1)[-1]))  # "[host:]pid"
            assert proc.environ().get("PREFECT__FLOW_RUN_ID") == run_id
            return psutil.Process(behind(proc.pid))
        time.sleep(0.5)
    raise AssertionError(f"flow run {run_id} never ran")


def wait_checkpoint(config, proc: psutil.Process, timeout: float) -> int:
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


@contextlib.contextmanager
def crash_report_held(stack, pool: str = "gpu", timeout: float = 60):
    """The pool worker's own report of a crashed run held back inside the block, as a busy machine
    holds it: after its runner reports the crash, the worker runs the run's on_crashed hooks in a
    fresh Python and reports the crash itself only once that has exited (cli.stack.worker). Here
    that process is stopped (SIGSTOP) until the block ends."""
    from cli.stack import services
    from tests.warm_python import behind

    (record,) = [p for p in services.read_state(Path(stack["state_dir"]))["processes"]
                 if p["name"] == f"worker-{pool}"]
    worker = psutil.Process(behind(record["pid"]))
    deadline, hook = time.monotonic() + timeout, None
    while hook is None:
        assert time.monotonic() < deadline, f"pool {pool}'s worker started no crash-hook process in {timeout:.0f} s"
        for proc in worker.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                argv = proc.cmdline()
                if any(a.endswith("_workspace_runtime_bootstrap.py") for a in argv) and "crashed" in argv:
                    hook = proc
                    break
        time.sleep(0.02)
    hook.suspend()
    try:
        yield
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            hook.resume()


def wait_attempt_running(stack, run_id, attempt: int, timeout: float = PIPELINE_TIMEOUT_S):
    """Wait until the run's `attempt`-th attempt is Running (its run count)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with client(stack) as c:
            run = c.read_flow_run(run_id)
        if (run.run_count >= attempt and run.state.is_running()) or \
                (run.state.is_final() and not run.state.is_crashed()):  # the caller's asserts say what went wrong
            return run
        time.sleep(0.5)
    raise AssertionError(f"attempt {attempt} of flow run {run_id} never ran; it is {run.state.name}")


def checkpoint_step(config) -> int | None:
    from gpt2.checkpoint import store

    latest = store.latest_checkpoint(config)
    return int(latest.rsplit("_", 1)[1]) if latest else None


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
    from gpt2.root import layout

    return layout.run_dir(config)


