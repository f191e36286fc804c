"""The ladder of GPU pools on the local stack, started as a user starts it
(`gpt2 stack up --gpu-pools gpu-spot,gpu-sky,gpu --no-worker gpu-spot`, then
`prefect deployment run gpt2/full-pipeline`):

1. three rungs: `gpu-spot` has no worker (no capacity), `gpu-sky`'s worker
   cannot start the job (its pool's command fails), `gpu` is healthy: the
   pipeline completes on `gpu`, the first two runs end Cancelled having
   trained nothing, the summary says why each rung was left; a run of a left
   rung that is started anyway afterwards (the race) stops without training;
2. preemption: the trainer on `gpu-sky` is SIGTERMed max_preemptions times,
   the next attempt runs on `gpu`, resumes from the SIGTERM checkpoint, and
   the final weights equal an uninterrupted run's.

On a stack of its own (one per module), beside the other end-to-end modules.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.stack.fixtures import clean_env, gpt2, last_json
from tests.flows.pipeline_stack import (
    PIPELINE_TIMEOUT_S,
    assert_completed,
    checkpoint_step,
    client,
    deployment_run,
    flow_run_process,
    layout_run_dir,
    overrides,
    wait_final,
)

pytestmark = pytest.mark.e2e

SPOT_WAIT_S = 20
STEPS = {"train.max_steps": 60, "train.checkpoint_every": 10_000, "train.eval_every": 10_000,
         "train.sample_every": 10_000, "train.total_batch_tokens": 256, "train.micro_batch_size": 2,
         "eval.every_steps": 0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("ladder-stack")
    env = clean_env(base / "home")
    info = last_json(gpt2(env, base, "stack", "up", "--root", str(base / "root"), "--gpu-pools",
                          "gpu-spot,gpu-sky,gpu", "--no-worker", "gpu-spot", "--json"))
    assert info["healthy"], info
    assert info["pools"] == {"cpu": True, "gpu-spot": False, "gpu-sky": True, "gpu": True}
    yield {**info, "env": env, "base": base}
    down = gpt2(env, base, "stack", "down", "--json", check=False)
    print(f"stack down: {down.stdout.strip()[-2000:]}")


@contextlib.contextmanager
def job_command_fails(stack, pool: str):
    """The pool's worker starts every job with a command that exits 1 at once:
    a job that cannot start (an unschedulable pod, a refused Vertex job)."""
    from prefect.client.schemas.actions import WorkPoolUpdate

    with client(stack) as c:
        template = c.read_work_pool(pool).base_job_template
    broken = json.loads(json.dumps(template))
    broken["variables"]["properties"]["command"]["default"] = "false"
    with client(stack) as c:
        c.update_work_pool(pool, WorkPoolUpdate(base_job_template=broken))
    try:
        yield
    finally:
        with client(stack) as c:
            c.update_work_pool(pool, WorkPoolUpdate(base_job_template=template))


def stage_runs(stack, parent_id: str, stage: str = "train") -> dict[str, object]:
    """The parent's runs of a GPU stage, by the pool each was started on."""
    with client(stack) as c:
        runs = [r for r in c.read_flow_runs(limit=200) if (r.idempotency_key or "").startswith(f"{parent_id}:{stage}")]
    return {r.work_pool_name: r for r in runs}


def first_rung_run(stack, parent_id: str, pool: str):
    """The parent's training run on `pool`, once the parent has started it."""
    deadline = time.monotonic() + PIPELINE_TIMEOUT_S
    while pool not in (runs := stage_runs(stack, parent_id)):
        assert time.monotonic() < deadline, f"the training run never reached rung {pool}"
        time.sleep(1)
    return runs[pool]


def attempts(config) -> list[dict]:
    from gpt2.train.attempts import read_attempts

    return read_attempts(layout_run_dir(config))


def lease_holders(config) -> list[str]:
    """The flow run of every generation of the run's lease, oldest first."""
    from gpt2.root import layout, storage

    lease_dir = layout.lease_dir(layout_run_dir(config))
    names = sorted(n for n in storage.list_dir(lease_dir) if n.endswith(".json"))
    return [storage.read_record(storage.join(lease_dir, n))["holder"]["flow_run_id"] for n in names]


def summary_text(stack, parent_id: str) -> str:
    with client(stack) as c:
        artifacts = c.read_artifacts()
    (found,) = [a for a in artifacts if a.key == "pipeline-summary" and str(a.flow_run_id) == parent_id]
    return found.data


def test_three_rungs_the_run_moves_down_to_the_one_with_capacity(stack):
    from gpt2.config.overrides import resolve_config
    from gpt2.root import layout, storage

    ladder = f"gpu-spot:1.0:{SPOT_WAIT_S},gpu-sky:2.0:300,gpu:4.0"
    params = overrides(stack, **{"train.lr": 3e-3, **STEPS, "runtime.gpu_pools": ladder})
    config = resolve_config("smoke", params)
    with job_command_fails(stack, "gpu-sky"):
        parent_id = deployment_run(stack, params)
        parent = wait_final(stack, parent_id)
    assert_completed(stack, parent, "the pipeline down the ladder")

    runs = stage_runs(stack, parent_id)
    assert set(runs) == {"gpu-spot", "gpu-sky", "gpu"}, runs
    spot, sky, gpu = runs["gpu-spot"], runs["gpu-sky"], runs["gpu"]
    assert spot.state.is_cancelled() and sky.state.is_cancelled() and gpu.state.is_completed()
    assert spot.run_count == 0 and sky.run_count == 0  # neither flow ran: nothing trained there
    # The waits as configured: the spot rung its 20 s, the broken one no longer than it took to crash.
    assert (sky.created - spot.created).total_seconds() >= SPOT_WAIT_S
    print(f"time lost on the left rungs: {(gpu.created - spot.created).total_seconds():.0f} s "
          f"(configured waits {SPOT_WAIT_S} s)")

    records = attempts(config)
    assert records and {r["pool"] for r in records} == {"gpu"} and {r["price_per_hour"] for r in records} == {4.0}
    holders = lease_holders(config)
    assert holders and set(holders) == {str(gpu.id)}  # one lease chain, one trainer

    text = summary_text(stack, parent_id)
    assert f"left gpu-spot: not started within {SPOT_WAIT_S} s" in text, text
    assert "left gpu-sky: its job crashed before the flow ran" in text and "ran on gpu" in text, text
    assert "by pool: gpu 1 attempt(s)" in text, text
    record = storage.read_record(layout.ladder_record(config, parent_id, "train"))
    assert [entry["pool"] for entry in record["left"]] == ["gpu-spot", "gpu-sky"]

    # The race: the left spot run is started anyway (a worker took it as the ladder moved
    # on; here by hand, as its pod would). It stops before training: no attempt, no lease.
    _start_left_run_by_hand(stack, spot)
    assert len(attempts(config)) == len(records)
    assert lease_holders(config) == holders


def _start_left_run_by_hand(stack, run) -> None:
    from prefect.states import Scheduled

    from flows import deployment_file

    with client(stack) as c:
        c.set_flow_run_state(run.id, Scheduled(), force=True)
    env = {**stack["env"], deployment_file.PROJECT_DIR_ENV: str(deployment_file.PROJECT_DIR)}
    done = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "execute", str(run.id)], env=env,
                          cwd=stack["base"], capture_output=True, text=True, timeout=PIPELINE_TIMEOUT_S)
    with client(stack) as c:
        final = c.read_flow_run(run.id)
    assert final.state.is_cancelled(), f"{final.state.name}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert "left by the ladder of GPU pools" in (final.state.message or ""), final.state.message


def test_preempted_max_times_on_a_rung_the_run_resumes_on_the_next(stack, tmp_path):
    from flows.stages import results_url
    from gpt2.config.overrides import resolve_config
    from gpt2.root import storage

    params = overrides(stack, **{"train.lr": 2e-3, **STEPS, "train.max_steps": 200,
                                 "runtime.gpu_pools": "gpu-sky:2.0:300:1,gpu:4.0"})
    config = resolve_config("smoke", params)
    parent_id = deployment_run(stack, params)
    sky = first_rung_run(stack, parent_id, "gpu-sky")
    proc = flow_run_process(stack, str(sky.id), timeout=PIPELINE_TIMEOUT_S)
    run_dir = storage.local_path(layout_run_dir(config))
    deadline = time.monotonic() + PIPELINE_TIMEOUT_S
    while not (run_dir / "lease").exists():
        assert time.monotonic() < deadline and proc.is_running(), "training never started"
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)  # a spot reclaim with notice: the trainer checkpoints
    proc.wait(timeout=120)
    stopped_at = checkpoint_step(config)
    assert stopped_at is not None and stopped_at < config.train.max_steps, "no SIGTERM checkpoint"

    parent = wait_final(stack, parent_id)
    assert_completed(stack, parent, "the pipeline after a preemption on its first rung")
    runs = stage_runs(stack, parent_id)
    assert runs["gpu-sky"].state.is_cancelled() and runs["gpu"].state.is_completed()
    result = storage.read_json(results_url(config, str(runs["gpu"].id)))
    assert result["resumed_from_step"] == stopped_at
    assert [r["pool"] for r in attempts(config)] == ["gpu-sky", "gpu"]
    assert "left gpu-sky: preempted 1 times" in summary_text(stack, parent_id)

    # The same run uninterrupted, by `gpt2 prepare` and `gpt2 train`, on a root of its own: the same weights.
    alone = {**{k: v for k, v in params.items() if k != "runtime.gpu_pools"},
             "runtime.root": str(tmp_path / "alone"), "runtime.work_dir": str(tmp_path / "work")}
    for command in ("prepare", "train"):
        gpt2(stack["env"], stack["base"], command, "--preset", "smoke", *_sets(alone))
    assert _same(_final_weights(config), _final_weights(resolve_config("smoke", alone)))


def _sets(params: dict) -> list[str]:
    return [arg for key, value in params.items()
            for arg in ("--set", f"{key}={value if isinstance(value, str) else json.dumps(value)}")]


def _final_weights(config) -> dict:
    """The final checkpoint's weights (after its marker's sha256 check)."""
    import safetensors.torch

    from gpt2.checkpoint import catalog, store
    from gpt2.root import storage

    latest = store.latest_checkpoint(config)
    assert latest and latest.endswith(f"step_{config.train.max_steps:06d}"), latest
    entry = catalog.read_marker(latest)["files"]["model.safetensors"]
    return safetensors.torch.load(store.read_verified(latest, "model.safetensors", entry))


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_server_restart_while_a_run_waits_on_a_rung_the_ladder_carries_on(stack):
    """The Prefect server goes away for 15 s while the training run waits on a rung
    with no capacity; back on the same port, the parent carries on from that rung's
    wait (measured on the server's own history) and moves down when it is over."""
    from gpt2.config.overrides import resolve_config

    params = overrides(stack, **{"train.lr": 4e-3, **STEPS, "runtime.gpu_pools": "gpu-spot:1.0:60,gpu:4.0"})
    config = resolve_config("smoke", params)
    parent_id = deployment_run(stack, params)
    first_rung_run(stack, parent_id, "gpu-spot")
    restart = (f"from pathlib import Path; from cli.stack.services import restart_server; "
               f"restart_server(Path({stack['state_dir']!r}), away_s=15)")
    subprocess.run([sys.executable, "-c", restart], env=stack["env"], cwd=stack["base"], check=True, timeout=300)

    parent = wait_final(stack, parent_id)
    assert_completed(stack, parent, "the pipeline across a server restart")
    runs = stage_runs(stack, parent_id)
    assert set(runs) == {"gpu-spot", "gpu"} and runs["gpu-spot"].state.is_cancelled()
    assert "left gpu-spot: not started within 60 s" in summary_text(stack, parent_id)
    assert [r["pool"] for r in attempts(config)] == ["gpu"]
