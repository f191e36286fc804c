"""Everything a training run builds before its first step: data, model,
optimizer, the resumed state, the micro-batch size.

Resuming is the default: the newest checkpoint of the run that loads and
verifies is restored (weights, optimizer, RNG, loader position, MLflow run),
so rerunning the same command after any crash continues the run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gpt2.checkpoint import staging, store
from gpt2.checkpoint.lease import Lease, LeaseHeld
from gpt2.checkpoint.optim_load import rank_state
from gpt2.config.identity import legacy_train_fingerprint, train_fingerprint
from gpt2.config.train import SCRATCH
from gpt2.config.tree import Config
from gpt2.data.loader import TrainLoader, first_reads, val_batches
from gpt2.data.manifest import check_shard_sizes, load_manifest
from gpt2.data.shard_source import ShardSource
from gpt2.errors import UserError
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv, barrier, control_group
from gpt2.root import layout, storage
from gpt2.train import compile_cache, memory
from gpt2.train.compile_choice import Built, CompileError, build, warm_up_or_fall_back
from gpt2.train.optim import load_state, make_optimizer
from gpt2.train.precision import Precision, choose_precision, device_caps, make_scaler
from gpt2.train.restore import restore_rng, shared_checkpoint
from gpt2.train.siblings import sibling_runs
from gpt2.train.startup import StartupParts
from gpt2.train.step import Batch, MemorySettings, StepContext, configured, find_micro_batch, warm_up
from gpt2.weights.init import init_weights, with_resolved_init
from gpt2.weights.readers import WeightsError

log = logging.getLogger(__name__)


class TrainingError(UserError, RuntimeError):
    """Training cannot go on; the message names the step and the setting to change."""


class InitChanged(TrainingError):
    """train.init_from differs from a run of otherwise the same settings that has checkpoints."""


@dataclass
class Session:
    config: Config
    env: DistEnv
    raw_model: GPT
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: TrainLoader
    val: list[Batch]
    ctx: StepContext
    micro_batch: int
    start_step: int = 0
    resumed_state: dict = field(default_factory=dict)
    resumed_url: str | None = None
    lease: Lease | None = None
    """This run's lease, held by rank 0 (gpt2.checkpoint.lease)."""
    memory: MemorySettings = field(default_factory=MemorySettings)
    """runtime.shard_optimizer and runtime.recompute as resolved for this run."""
    compile_cache: compile_cache.Travel | None = None
    """The compiled program's travel (gpt2.train.compile_cache); None when not compiling (status `failed`:
    compiling failed under runtime.compile=auto and the run trains eagerly)."""
    precision: Precision | None = None
    """train.precision as resolved for this device (gpt2.train.precision)."""
    compiled: bool = False
    """The steps run a compiled model (gpt2.train.compile_choice)."""


def check_batch_shape(config: Config, world_size: int) -> int:
    """Sequences per rank per step; the total batch must split evenly."""
    T, total = config.model.block_size, config.train.total_batch_tokens
    if total % (T * world_size):
        raise TrainingError(
            f"train.total_batch_tokens={total} is not a multiple of model.block_size × devices "
            f"= {T} × {world_size}; choose a multiple of {T * world_size}"
        )
    return total // (T * world_size)


def resume_from(config: Config, env: DistEnv, fresh: bool, fence=None) -> store.Checkpoint | None:
    """Rank 0 picks (and on --fresh clears), reads and verifies the
    checkpoint, then sends its bytes to the other ranks: one read of the root
    instead of one per GPU. A run none of whose checkpoints verifies stops on
    every rank."""
    run_dir = layout.run_dir(config)
    ckpt, error = None, None
    if env.is_main:
        try:
            if fresh:
                log.info("--fresh: deleting the checkpoints of %s", run_dir)
                store.clear_run(run_dir)
                storage.remove(layout.tracking_record(run_dir))  # a fresh run opens a new MLflow run
                staging.clear(config)
            else:  # a newer local copy (its trainer died uploading it) goes to the root first
                staging.recover(config, fence)
            staging.claim(config)
            # The optimizer's files verified, not decoded: each rank reads its own part (optim_load).
            ckpt = store.resume_checkpoint(run_dir, optimizer=False) or (None if fresh else
                                                                         _from_earlier_release(config))
            refusal = sibling_runs(config, fresh) if ckpt is None else None
            if refusal:
                raise InitChanged(refusal)
        except (store.CheckpointError, InitChanged) as err:
            error = err
    ckpt = shared_checkpoint(ckpt, error, env)
    if ckpt:
        log.info("resuming from %s (step %d)", ckpt.url, ckpt.step)
    return ckpt


def _from_earlier_release(config: Config) -> store.Checkpoint | None:
    """A run started before 0.2 lives under its old name (which counted the
    micro-batch and the intervals): resume it from there; new checkpoints go
    under the new name."""
    legacy = layout.legacy_run_dir(config)
    if legacy == layout.run_dir(config):
        return None
    ckpt = store.resume_checkpoint(legacy, optimizer=False)
    if ckpt is not None:
        log.warning("continuing the run at %s (named by an earlier release); new checkpoints go to %s",
                    legacy, layout.run_dir(config))
    return ckpt


def choose_micro_batch(config: Config, raw: GPT, seqs_per_rank: int, ctx: StepContext) -> tuple[int, MemorySettings]:
    """The micro-batch and the memory settings (runtime.shard_optimizer,
    runtime.recompute); `auto` settings are searched with an `auto`
    micro-batch only, and are off beside a fixed one."""
    setting, rt = config.train.micro_batch_size, config.runtime
    if rt.shard_optimizer is True and ctx.env.world_size == 1:
        log.info("runtime.shard_optimizer=true has no effect with one process: nothing to shard across")
    if setting != "auto":
        if seqs_per_rank % setting:
            raise TrainingError(
                f"train.micro_batch_size={setting} does not divide the {seqs_per_rank} sequences each of "
                f"{ctx.env.world_size} device(s) gets per step; choose a divisor of {seqs_per_rank} or auto"
            )
        chosen, settings = setting, configured(rt.shard_optimizer, rt.recompute, ctx.env.world_size)
    else:
        probe_ctx = StepContext(ctx.env, ctx.amp, ctx.grad_clip,
                                memory.probe_limit_mb(ctx.env.device, ctx.memory_limit_mb), ctx.scaler)
        found = find_micro_batch(
            raw, lambda shard=False: make_optimizer(raw, config.train, ctx.env.device_type, shard), seqs_per_rank,
            config.model.block_size, config.model.vocab_size, probe_ctx, rt.shard_optimizer, rt.recompute)
        chosen, settings = int(found), found.memory
        log.info("train.micro_batch_size=auto chose %d sequences x %d tokens (%d accumulation steps)",
                 chosen, config.model.block_size, seqs_per_rank // chosen)
    raw.recompute = settings.recompute
    log.info("memory settings: runtime.shard_optimizer=%s -> %s, runtime.recompute=%s -> %s",
             rt.shard_optimizer, settings.shard_optimizer, rt.recompute, settings.recompute)
    return chosen, settings


def resolve_precision(config: Config, device: torch.device) -> Precision:
    """train.precision on this device (gpt2.train.precision), said once in the log."""
    try:
        precision = choose_precision(config.train.precision, device_caps(device))
    except ValueError as err:
        raise TrainingError(str(err)) from err
    log.info("train.precision=%s: %s", config.train.precision, precision.describe())
    return precision


def resolve_init(config: Config, env: DistEnv) -> Config:
    """train.init_from's weights fetched by rank 0 alone, the others waiting on the control group
    (the launcher fetches before any rank starts; a run.json written by hand may name weights not
    fetched yet); then every rank reads the root's record (gpt2.weights.init)."""
    error = None
    if env.is_main:
        try:
            config = with_resolved_init(config)
        except UserError as err:
            error = err
    if env.is_distributed:
        box = [str(error) if error else None]
        dist.broadcast_object_list(box, src=0, group=control_group())  # waits for rank 0's fetch
        error = error or (WeightsError(box[0]) if box[0] else None)
    if error is not None:
        raise error
    return config if env.is_main else with_resolved_init(config, fetching=False)


def take_lease(config: Config, env: DistEnv, flow_run_id: str | None) -> Lease | None:
    """Rank 0 takes the run's lease before touching its checkpoints (--fresh
    included); a refusal stops every rank."""
    lease, error = None, None
    if env.is_main:
        try:
            lease = Lease(layout.lease_dir(layout.run_dir(config)), config.runtime.lease_ttl_s, flow_run_id)
            lease.acquire(config.runtime.lease_wait_s)
        except LeaseHeld as err:
            error = err
    if env.is_distributed:
        box = [str(error) if error else None]
        dist.broadcast_object_list(box, src=0, group=control_group())  # waits up to runtime.lease_wait_s
        error = error or (LeaseHeld(box[0]) if box[0] else None)
    if error is not None:
        raise error
    return lease


def open_session(config: Config, env: DistEnv, fresh: bool = False, lease: Lease | None = None,
                 clock: StartupParts | None = None) -> Session:
    """Everything before the first step; `lease`: the run's, held by rank 0;
    `clock`: times the start-up's parts (gpt2.train.startup)."""
    part = clock.part if clock else (lambda name: contextlib.nullcontext())
    url = layout.manifest(config)
    with part("data"):
        manifest = load_manifest(url)
        check_shard_sizes(url, manifest)  # a shard lost or cut short fails now, not when the run reaches it
        source = ShardSource(url, manifest, layout.shard_cache_dir(config, manifest.name, manifest.fingerprint), env)
    seqs_per_rank = check_batch_shape(config, env.world_size)
    with part("checkpoint"):
        ckpt = resume_from(config, env, fresh, lease.check if lease else None)
    order_seed = config.train.seed if config.data.shuffle else None
    for entry in first_reads(manifest, config.train.total_batch_tokens, ckpt.state.get("loader") if ckpt else None,
                             order_seed):
        source.prefetch(entry)  # a remote root's first shards download while the model is built, probed, compiled
    known = (train_fingerprint(config), legacy_train_fingerprint(config))
    if ckpt and ckpt.state.get("train_fingerprint", known[0]) not in known:
        raise TrainingError(f"checkpoint {ckpt.url} belongs to another training identity; "
                            "its directory was copied or renamed by hand")
    memory.set_cuda_limit(env.device, config.runtime.memory_limit_mb)

    torch.manual_seed(config.train.seed)  # weights init is the same on every device
    raw = GPT(config.model)
    with part("checkpoint"):
        if ckpt:
            store.load_weights(raw, ckpt.model)
        elif config.train.init_from != SCRATCH:  # a fine-tune's first start: the root's copy, never the source
            store.load_weights(raw, init_weights(config))
        raw.to(env.device)
    precision = resolve_precision(config, env.device)
    scaler = make_scaler(precision, env.device, ckpt.state.get("loss_scaler") if ckpt else None)
    ctx = StepContext(env, precision.dtype, config.train.grad_clip, config.runtime.memory_limit_mb, scaler)
    # The micro-batch probe runs eagerly: compiled, every size it tries would be
    # another compilation. Eager code keeps more activations than fused kernels
    # do, so a size that fits eagerly fits compiled as a rule.
    with part("probe"):
        micro, mem = choose_micro_batch(config, raw, seqs_per_rank, ctx)
    # Built after the search, which decides whether it is sharded; a sharded
    # one loads only this rank's part of the (always full) saved state.
    optimizer = make_optimizer(raw, config.train, env.device_type, mem.shard_optimizer)
    with part("checkpoint"):
        if ckpt:
            load_state(optimizer, rank_state(ckpt.url, ckpt.entries, optimizer, env))
            restore_rng(ckpt.rng, env.device)
    began = time.perf_counter()  # while the first shards download (first_reads)
    built = _built(config, env, raw, optimizer, micro, mem.recompute, ctx, precision)
    # Eager from the start (no compile travel), the model's build is `other`,
    # as gpt2.train.startup says: only a compilation, tried or loaded, is `compile`.
    if clock and built.travel is not None:
        clock.add("compile", time.perf_counter() - began)

    with part("data"):
        loader = TrainLoader(source, config.model.block_size, config.train.total_batch_tokens, micro, env, order_seed)
        if ckpt and "loader" in ckpt.state:
            loader.load_state_dict(ckpt.state["loader"])
        val_tokens = config.train.val_steps * config.train.total_batch_tokens
        val = val_batches(source, config.model.block_size, val_tokens, micro, env)
    barrier(env)
    return Session(config, env, raw, built.model, optimizer, loader, val, ctx, micro,
                   start_step=ckpt.step if ckpt else 0, resumed_state=ckpt.state if ckpt else {},
                   resumed_url=ckpt.url if ckpt else None, lease=lease, memory=mem, compile_cache=built.travel,
                   precision=precision, compiled=built.compiling)


def _built(config: Config, env: DistEnv, raw: GPT, optimizer: torch.optim.Optimizer, micro: int, recompute: bool,
           ctx: StepContext, precision: Precision) -> Built:
    """The model the steps run, compiled and warmed up where runtime.compile and
    the device say so, eager where compiling fails under `auto` (gpt2.train.compile_choice)."""
    def warm(model: torch.nn.Module) -> None:
        warm_up(model, raw, optimizer, micro, config.model.block_size, ctx)

    try:
        return warm_up_or_fall_back(build(raw, config, env, micro, recompute, precision.name), raw, config, env, warm)
    except torch.OutOfMemoryError as err:
        raise TrainingError(memory.oom_message(config, micro, env.device, 1, err)) from err
    except CompileError as err:
        raise TrainingError(str(err)) from err
