"""The ladder of GPU pools on the local stack: the trainer on `gpu-sky` is SIGTERMed
max_preemptions times, the next attempt runs on `gpu`, resumes from the SIGTERM
checkpoint, and the final weights equal an uninterrupted run's. Apart from
test_pipeline_ladder.py so that the two run side by side on two pytest workers.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.background import started
from tests.cli.stack.fixtures import gpt2
from tests.flows.ladder_runs import STEPS, attempts, first_rung_run, stage_runs, summary_text
from tests.flows.pipeline_stack import (
    PIPELINE_TIMEOUT_S,
    assert_completed,
    checkpoint_step,
    deployment_run,
    flow_run_process,
    layout_run_dir,
    overrides,
    wait_final,
)
from tests.tiers import STACK_B

# One pytest worker's stack for this module and the other modules of STACK_B (tests/tiers.py).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(STACK_B)]


def test_preempted_max_times_on_a_rung_the_run_resumes_on_the_next(stack, tmp_path):
    from flows.stages import results_url
    from gpt2.config.overrides import resolve_config
    from gpt2.root import storage

    params = overrides(stack, **{"train.lr": 2e-3, **STEPS,
                                 "runtime.gpu_pools": "gpu-sky:2.0:300:1,gpu:4.0"})
    config = resolve_config("smoke", params)
    # The same run uninterrupted, by `gpt2 prepare` and `gpt2 train`, on a root of its own: trained meanwhile.
    alone = {**{k: v for k, v in params.items() if k != "runtime.gpu_pools"},
             "runtime.root": str(tmp_path / "alone"), "runtime.work_dir": str(tmp_path / "work")}
    reference = started(_prepare_and_train, stack, alone)
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

    # The uninterrupted run's weights are the same.
    reference.result()
    assert _same(_final_weights(config), _final_weights(resolve_config("smoke", alone)))


def _prepare_and_train(stack, params: dict) -> None:
    for command in ("prepare", "train"):
        gpt2(stack["env"], stack["base"], command, "--preset", "smoke", *_sets(params))


def _sets(params: dict) -> list[str]:
    return [arg for key, value in params.items()
            for arg in ("--set", f"{key}={value if isinstance(value, str) else json.dumps(value)}")]


def _final_weights(config) -> dict:
    """The final checkpoint's weights (after its marker's sha256 check)."""
    import safetensors.torch

    from gpt2.checkpoint import catalog, store

    latest = store.latest_checkpoint(config)
    assert latest and latest.endswith(f"step_{config.train.max_steps:06d}"), latest
    entry = catalog.read_marker(latest)["files"]["model.safetensors"]
    return safetensors.torch.load(store.read_verified(latest, "model.safetensors", entry))


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
