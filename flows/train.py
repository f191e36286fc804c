"""Stage flow `gpt2-train`: train on the data stage's shards, resumably.

    gpt2 train --preset smoke                        # via the CLI
    python -m flows.train --preset smoke [--fresh]   # the flow directly

The trainer runs one process per GPU of the machine it lands on
(`runtime.nproc_per_node=auto`); more than one runs
`torchrun --nproc_per_node=N -m gpt2.train --config run.json` and streams its
logs here. Rerunning (or retrying) continues from the newest checkpoint; a
finished run is a cache hit.
"""

from __future__ import annotations

import os
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from flows.entry import flow_main
from flows.ladder import left_state
from flows.stages import publish_result
from gpt2.checkpoint import store
from gpt2.checkpoint.lease import Lease
from gpt2.config.overrides import resolve_config
from gpt2.config.tree import Config
from gpt2.data.epoch import with_resolved_steps
from gpt2.data.manifest import load_manifest
from gpt2.root import layout, storage
from gpt2.weights.init import with_resolved_init
from tasks.common import bind, run_cached
from tasks.tracking import flow_run_tags
from tasks.train import train as train_task


def final_checkpoint(config: Config, result: dict) -> str | None:
    """The cached training result's final checkpoint, while it is still the
    run's newest (None otherwise); raises store.CheckpointError when it does
    not verify (every file against its marker's sha256, as evaluate and export
    will). What a cached result is worth, here and on a read-only root
    (flows.read_only)."""
    url = result.get("checkpoint")
    if not url or url != store.latest_checkpoint(config):
        return None
    store.verify_checkpoint(url)
    return url


def _finished(config: Config, result: dict) -> bool:
    """A cached result is only good while its final checkpoint exists and
    verifies: otherwise the trainer runs again, resumes from the newest
    checkpoint that verifies and rewrites the damaged steps, or says that none
    does."""
    try:
        return final_checkpoint(config, result) is not None
    except store.CheckpointError as err:
        get_run_logger().warning("the finished run's final checkpoint is damaged (%s): training again from the "
                                 "newest checkpoint that verifies", err)
        return False


def _start_over(config: Config) -> None:
    """--fresh, once per flow run: a rescheduled or retried run of this same
    flow run must resume what it already trained, not wipe it again."""
    run_dir = layout.run_dir(config)
    marker = layout.fresh_marker(run_dir, flow_run.id)
    if storage.exists(marker):
        get_run_logger().info("--fresh already applied by this flow run; resuming")
        return
    # Under the run's lease: --fresh never deletes what a live trainer is writing.
    lease = Lease(layout.lease_dir(run_dir), config.runtime.lease_ttl_s, str(flow_run.id) if flow_run.id else None)
    lease.acquire(config.runtime.lease_wait_s)
    try:
        store.clear_run(run_dir)
        storage.write_bytes_atomic(marker, b"")
    finally:
        lease.release()


def run_train_stage(config: Config, fresh: bool = False, parent_run_id: str | None = None) -> dict[str, Any]:
    load_manifest(layout.manifest(config))  # fail fast, saying how to make the data
    tags = flow_run_tags()
    if fresh:
        _start_over(config)
        result = bind(train_task, config, refresh=True)(config, parent_run_id, tags)
        cached = False
    else:
        result, cached = run_cached(train_task, config, parent_run_id, tags, valid=lambda r: _finished(config, r))
    return {**result, "cached": cached}


@flow(name="gpt2-train", log_prints=False)
def train_flow(preset: str = "smoke", overrides: dict[str, Any] | None = None, root: str | None = None,
               fresh: bool = False, parent_run_id: str | None = None) -> dict[str, Any]:
    """Train a preset plus dotted-key overrides; returns the training result."""
    # `epoch` becomes a number first: the run's name depends on it.
    # train.init_from's weights fetched into the root (once): their sha256 names the run too.
    config = with_resolved_init(with_resolved_steps(resolve_config(preset, overrides or {}, root=root)))
    if (left := left_state(config)) is not None:
        return left
    get_run_logger().info("training %s (%d steps) -> %s", layout.run_name(config),
                          config.train.max_steps, layout.run_dir(config))
    try:
        result = run_train_stage(config, fresh, parent_run_id)
    except BaseException:
        step_aside_if_superseded()
        raise
    publish_result(config, result)  # for a parent flow that started this run as a deployment
    return result


def step_aside_if_superseded() -> None:
    """End this process without a word to Prefect when a later attempt of the
    same flow run has started: a machine that froze past the zombie window
    comes back to find its run rescheduled, its trainer fenced by the newer
    attempt's lease (or its engine cancelled). Any state it reported now
    (Failed, Crashed) would land on the newer attempt, which trains on; its
    worker proposes nothing for a process that exits 0."""
    if not flow_run.id:
        return
    with get_client(sync_client=True) as client:
        now = client.read_flow_run(flow_run.id).run_count
    if now > flow_run.run_count:
        get_run_logger().warning("attempt %d of this flow run was superseded by attempt %d, which trains on; "
                                 "stopping without reporting a state", flow_run.run_count, now)
        os._exit(0)  # no final state, no crash report: the run is the newer attempt's


def main() -> None:
    flow_main(train_flow, __doc__, fresh=False)


if __name__ == "__main__":
    main()
