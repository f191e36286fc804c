"""Fixtures of the flow tests: one local stack per pytest worker, shared by every module that runs
pipelines on it, each module on a root of its own."""

from __future__ import annotations

import pytest

from tests.cli.stack.fixtures import clean_env, gpt2, last_json

# The ladder's pools beside the default ones: `gpu-spot` has no worker (a rung with no capacity),
# `gpu-sky` and `gpu` have one. The plain pipeline runs on `cpu` and `gpu` alone, so one stack
# shaped for the ladder serves every pipeline module.
GPU_POOLS = "gpu-spot,gpu-sky,gpu"
POOLS = {"cpu": True, "gpu-spot": False, "gpu-sky": True, "gpu": True}


@pytest.fixture(scope="session")
def shared_stack(tmp_path_factory, warm_interpreter):
    """`gpt2 stack up` once per pytest worker (a Prefect server, an MLflow server, a worker per
    pool, the automations), started at the first module that asks and stopped with the session:
    a stack's start and stop cost about a minute, and the modules on one worker run one after
    another, so they never see each other's runs in flight. Each module leaves the stack as it
    found it (a paused pool resumed, a pool's template restored, a restarted server back).

    Started from the warm interpreter (tests/warm_python): the stack's workers, the flow-run
    processes they start, and those runs' preflights and trainers are forked with torch and
    MLflow imported (each still a process of its own, its signals and exit code its own; a test
    that signals one finds it with `tests.warm_python.behind`); its servers start as users'
    do. The cold start of each of those processes is the first pipeline's in
    tests/docs/test_getting_started.py (`gpt2 run` as written), the fault soak's stack
    (tests/bench/soak) and `gpt2 stack up` in a fresh home (tests/cli/stack/test_services.py)."""
    base = tmp_path_factory.mktemp("shared-stack")
    env = clean_env(base / "home")
    python = warm_interpreter.executable if warm_interpreter is not None else None
    info = last_json(gpt2(env, base, "stack", "up", "--root", str(base / "root"), "--gpu-pools", GPU_POOLS,
                          "--no-worker", "gpu-spot", "--json", python=python))
    assert info["healthy"], info
    assert info["pools"] == POOLS, info["pools"]
    yield {**info, "env": env}
    down = gpt2(env, base, "stack", "down", "--json", check=False)
    print(f"stack down: {down.stdout.strip()[-2000:]}")  # seconds per process, and what had to be killed


@pytest.fixture(scope="module")
def stack(shared_stack, tmp_path_factory):
    """The shared stack as one module sees it: a root of its own (its data stage does the work
    once, its runs and checkpoints apart from other modules'), a directory of its own for the
    commands it runs. The stack's environment, servers and state directory are the shared ones."""
    base = tmp_path_factory.mktemp("stack")
    return {**shared_stack, "base": base, "root": str(base / "root")}
