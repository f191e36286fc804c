"""`gpt2 stack up --gpu-pools/--no-worker`: which pools and deployments the
local stack stands up for a ladder of GPU pools, and what it refuses before
starting anything (the stack itself is started in tests/flows/test_pipeline_ladder.py)."""

from __future__ import annotations

import pytest

from cli.stack.prefect_setup import LadderPoolsError, stack_deployments, stack_pools
from tests.cli.stack.fixtures import clean_env, gpt2


def test_todays_stack_is_the_cpu_and_gpu_pools_and_their_six_deployments():
    pools = stack_pools([], [])
    assert pools == {"cpu": True, "gpu": True}
    assert stack_deployments(pools) == ["full-pipeline", "sweep", "data", "train", "evaluate", "export"]


def test_a_ladder_adds_its_rungs_in_order_with_their_deployments():
    pools = stack_pools(["gpu-spot", "gpu-sky"], ["gpu-spot"])
    assert list(pools.items()) == [("cpu", True), ("gpu-spot", False), ("gpu-sky", True), ("gpu", True)]
    assert set(stack_deployments(pools)) - set(stack_deployments(stack_pools([], []))) == {
        "train-gpu-spot", "evaluate-gpu-spot", "train-gpu-sky", "evaluate-gpu-sky"}


@pytest.mark.parametrize("gpu_pools,no_worker,named", [
    (["gpu-nowhere"], [], "--gpu-pools gpu-nowhere: prefect.yaml has no deployments on work pool 'gpu-nowhere'"),
    (["cpu"], [], "the cpu pool is not a GPU pool"),
    (["gpu-spot"], ["gpu-sky"], "--no-worker gpu-sky: not a pool of this stack"),
    ([], ["cpu"], "--no-worker cpu"),
])
def test_pools_it_cannot_stand_up_are_refused_by_name(gpu_pools, no_worker, named):
    with pytest.raises(LadderPoolsError, match=named):
        stack_pools(gpu_pools, no_worker)


def test_the_command_refuses_before_starting_anything(tmp_path):
    done = gpt2(clean_env(tmp_path / "home"), tmp_path, "stack", "up", "--state-dir", str(tmp_path / "state"),
                "--gpu-pools", "gpu-spot,gpu-nowhere", check=False)
    assert done.returncode == 1
    assert "gpu-nowhere" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "state" / "stack.json").exists()


def test_a_ladder_given_to_gpt2_run_is_refused_before_anything_starts(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    out = CliRunner().invoke(app, ["run", "--preset", "smoke", "--root", str(tmp_path / "root"),
                                   "--set", "runtime.gpu_pools=gpu-spot,gpu"])
    assert out.exit_code == 1
    assert "runtime.gpu_pools is a ladder of work pools, but this pipeline runs its stages in this process" \
        in out.output
    assert not (tmp_path / "root").exists()  # no server, no stage, nothing written


@pytest.mark.e2e  # a Prefect server of its own where the worker has none yet
def test_a_rung_without_its_deployments_is_named_before_any_stage_runs(prefect_server):
    """Against a real Prefect server with no deployments (flows.ladder.check_deployed,
    which the parent runs before its data stage)."""
    from flows.ladder import LadderNotDeployed, check_deployed
    from gpt2.config.overrides import resolve_config

    config = resolve_config("smoke", {"runtime.gpu_pools": "gpu-nowhere,gpu"})
    with pytest.raises(LadderNotDeployed) as err:
        check_deployed(config)
    message = str(err.value)
    for name in ("gpt2-train/train-gpu-nowhere (rung gpu-nowhere) is not deployed",
                 "gpt2-eval/evaluate-gpu-nowhere (rung gpu-nowhere) is not deployed",
                 "gpt2-train/train (rung gpu) is not deployed"):
        assert name in message
