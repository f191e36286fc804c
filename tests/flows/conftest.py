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
def shared_stack(tmp_path_factory):
    """`gpt2 stack up` once per pytest worker (a Prefect server, an MLflow server, a worker per
    pool, the automations), started at the first module that asks and stopped with the session:
    a stack's start and stop cost about a minute, and the modules on one worker run one after
    another, so they never see each other's runs in flight. Each module leaves the stack as it
    found it (a paused pool resumed, a pool's template restored, a restarted server back)."""
    base = tmp_path_factory.mktemp("shared-stack")
    env = clean_env(base / "home")
    info = last_json(gpt2(env, base, "stack", "up", "--root", str(base / "root"), "--gpu-pools", GPU_POOLS,
                          "--no-worker", "gpu-spot", "--json"))
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
