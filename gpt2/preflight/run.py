"""The preflight's order: every check runs even when an earlier one failed
(a user fixes everything at once), except those that need what failed; the
checks of the root run on rank 0, those of the machine on each machine's
first rank, those of the device on every rank, and rank 0 reports them all.

It never takes the run's lease and never writes a checkpoint, a lease or an
attempt record: what it writes under the root is its probe object, removed
again whatever happens, and, with runtime.compile, the run's compiled program
(gpt2.train.compile_cache), so that even the run's first attempt starts warm."""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.distributed as dist

from gpt2.config.train import SCRATCH
from gpt2.config.tree import Config
from gpt2.cost.plan import CHECKPOINT_BYTES_PER_PARAM, count_every, model_size
from gpt2.data.epoch import planned_steps, with_resolved_steps
from gpt2.errors import UserError
from gpt2.preflight import collectives, host
from gpt2.preflight import storage as root_checks
from gpt2.preflight.report import Check, Failed, Outcome, Report
from gpt2.preflight.steps import step_checks
from gpt2.process.distributed import (
    STARTUP_TIMEOUT_S,
    DeviceUnavailable,
    DistEnv,
    check_device_available,
    control_group,
    distributed,
    pick_device,
)
from gpt2.root import layout
from gpt2.weights.init import with_resolved_init

DEFAULT_STEPS = 5
"""Timed steps after the first (which compiles): enough for a steady median."""
JOIN_TIMEOUT_S = 300.0
"""How long rank 0 waits for every rank to answer the roll call (nodes start apart)."""
SEVERITY = {"skipped": 0, "ok": 1, "warn": 2, "fail": 3}


def _resolve_steps(config: Config) -> tuple[Config, str | None]:
    """The config with train.max_steps a number; the note says when it is assumed."""
    try:
        return with_resolved_steps(config), None
    except UserError:  # `epoch` without a manifest: the data check says why
        steps, _, note = planned_steps(config)
        return config.model_copy(update={"train": config.train.model_copy(update={"max_steps": steps})}), note


def _disk_needs(config: Config, manifest_bytes: int | None, checkpoint_bytes: int) -> dict[str, int]:
    """Local bytes the run needs, by where (the keys start with the place
    host.disk sums them for): shards cached from a remote root, the staged
    copy of a checkpoint, and for a local root the checkpoints it keeps."""
    t = config.train
    remote = layout.local_root(config) is None
    kept = min(t.keep_checkpoints + 1, count_every(int(t.max_steps), t.checkpoint_every))
    return {"work dir: shard cache": (manifest_bytes or 0) if remote else 0,
            "work dir: checkpoint staging": checkpoint_bytes,
            "root: checkpoints": 0 if remote else kept * checkpoint_bytes}


def preflight(config: Config, synthetic: bool = False, steps: int = DEFAULT_STEPS,
              join_timeout_s: float = JOIN_TIMEOUT_S, show: Callable[[Check], None] | None = None) -> Report:
    """Run every check on this rank; rank 0's report holds every rank's outcome
    (`show` is called on rank 0 as each of its checks finishes)."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    report = Report(show if rank == 0 else None)
    config, steps_note = _resolve_steps(config)
    # A fine-tune whose weights are in the root: its run's name and its model's vocabulary (gpt2.weights.init).
    config = with_resolved_init(config, fetching=False, required=False)
    store = None
    if world > 1:
        store = collectives.roll_call_store(join_timeout_s)
        missing = collectives.roll_call(store, rank, world, join_timeout_s)
        if missing:
            failure = collectives.missing_ranks(missing, world, join_timeout_s)
            report.check("collectives", _raising(failure))
            if rank == 0:  # what needs no other rank still runs, so everything is fixed at once
                _local_checks(report, config, DistEnv(0, 0, world, _device(config)), synthetic, steps_note)
                for name in ("memory", "compile", "throughput"):
                    report.skip(name, "needs every rank (see collectives)")
            return report
    rt = config.runtime
    try:
        check_device_available(rt.device)
    except DeviceUnavailable as err:  # everything but the device is still worth knowing now
        report.check("devices", _raising(Failed(str(err))))
        _local_checks(report, config, DistEnv(rank, 0, world, torch.device("cpu")), synthetic, steps_note,
                      devices=False)
        for name in ("collectives", "memory", "compile", "throughput"):
            report.skip(name, "needs a usable device (see devices)")
        return report
    with distributed(rt.device, rt.collective_timeout_s, STARTUP_TIMEOUT_S, store=store) as env:
        _local_checks(report, config, env, synthetic, steps_note)
        if env.is_distributed:
            report.check("collectives", lambda: collectives.all_reduce_check(env))
        else:
            report.skip("collectives", "one rank: nothing to reduce across")
        if report.status("devices") == "fail":
            for name in ("memory", "compile", "throughput"):
                report.skip(name, "needs a usable device (see devices)")
        else:
            step_checks(report, config, env, steps, steps_note)
        if env.is_distributed:
            _merge_ranks(report, env)
    return report


def _raising(err: Exception) -> Callable[[], Outcome]:
    def body() -> Outcome:
        raise err
    return body


def _device(config: Config) -> torch.device:
    try:
        return pick_device(config.runtime.device, int(os.environ.get("LOCAL_RANK", 0)))
    except DeviceUnavailable:
        return torch.device("cpu")


def _local_checks(report: Report, config: Config, env: DistEnv, synthetic: bool, steps_note: str | None,
                  devices: bool = True) -> None:
    """The checks that need no collective: devices on every rank; the root's
    on rank 0; the disk on each machine's first rank."""
    if devices:
        report.check("devices", lambda: host.devices(config, env))
    n_params, _ = model_size(config)
    checkpoint_bytes = n_params * CHECKPOINT_BYTES_PER_PARAM
    manifest_bytes = None
    if env.is_main:
        if synthetic:
            report.skip("data", "--synthetic: the steps ran on random tokens and the root's data was not checked")
        else:
            found = {}

            def data_body() -> Outcome:
                outcome, found["manifest"] = root_checks.data(config)
                return outcome

            report.check("data", data_body)
            if "manifest" in found:
                manifest_bytes = sum(e.bytes for e in found["manifest"].shards)
        if config.train.init_from != SCRATCH:  # a fine-tune reads its weights first
            report.check("weights", lambda: root_checks.init_weights(config))
        report.check("root", lambda: root_checks.root(config, checkpoint_bytes, env.world_size > 1
                                                      or config.runtime.nnodes > 1))
        report.check("lease", lambda: host.lease(config))
    if env.local_rank == 0:
        report.check("disk", lambda: host.disk(config, _disk_needs(config, manifest_bytes, checkpoint_bytes)))
    if env.is_main:
        report.check("tracking", lambda: host.tracking(config))


def _merge_ranks(report: Report, env: DistEnv) -> None:
    """Every rank's checks into rank 0's report: a check's status is its worst
    over the ranks, and its line names the ranks where it was worse than ok."""
    everyone: list[dict[str, Check] | None] = [None] * env.world_size
    dist.all_gather_object(everyone, report.checks, group=control_group())
    if not env.is_main:
        return
    for rank, checks in enumerate(everyone[1:], start=1):
        for name, theirs in (checks or {}).items():
            mine = report.checks.get(name)
            if mine is not None and SEVERITY[theirs.status] <= max(SEVERITY[mine.status], SEVERITY["ok"]):
                continue
            merged = Check(name, theirs.status, max(theirs.seconds, mine.seconds if mine else 0),
                           f"rank {rank}: {theirs.detail}" + (f" | rank 0: {mine.detail}" if mine else ""),
                           {**(mine.figures if mine else {}), **theirs.figures})
            report.checks[name] = merged
            report.show(merged)

