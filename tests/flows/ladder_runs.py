"""Reading the ladder of GPU pools' runs back on the local stack: the parent's runs of a stage by
rung, the run's attempts and lease holders, the pipeline's summary (tests/flows/test_pipeline_ladder*.py)."""

from __future__ import annotations

import time

from tests.flows.pipeline_stack import PIPELINE_TIMEOUT_S, client, layout_run_dir

# A short training run: the ladder's tests are about where it runs, not about training.
STEPS = {"train.max_steps": 60, "train.checkpoint_every": 10_000, "train.eval_every": 10_000,
         "train.sample_every": 10_000, "train.total_batch_tokens": 256, "train.micro_batch_size": 2,
         "eval.every_steps": 0}


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
