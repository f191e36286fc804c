"""What a training run will cost, worked out before anyone rents a GPU (`gpt2 plan`).

From a config and a GPU choice: tokens and steps, checkpoints and their size,
local disk on the data VM and on the GPU node, the micro-batch `auto` is
expected to pick with the memory savers it needs (ZeRO-1, activation
recomputation: runtime.shard_optimizer, runtime.recompute), and the time, GPU-hours and price at an assumed MFU.

Time = FLOPs / (peak dense FLOP/s × GPUs × MFU), the peak of the precision the run
trains in there (train.precision: bf16, or fp16 on a card without bf16), with FLOPs per token from
gpt2.model (6·N + 12·L·C·T, the MFU convention of gpt2.train.throughput).
Counted: the training steps and the validation passes (forward only, a third
of a training step's FLOPs per token). Not counted: start-up, compilation, the
micro-batch probe, checkpoint writes, HellaSwag during training, the data stage.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from gpt2.config.data import BUILTIN_PREFIX, SourceError, builtin_documents
from gpt2.config.train import SCRATCH
from gpt2.config.tree import Config
from gpt2.cost.gpus import Gpu, PlanError, gpu
from gpt2.cost.measured import measured_mfu
from gpt2.data import disk
from gpt2.data.download import resolve_source
from gpt2.data.epoch import planned_steps
from gpt2.data.sources import SourceFiles, file_format, is_remote
from gpt2.ladder import plan as ladder_plan
from gpt2.model import parameter_count, training_flops_per_token
from gpt2.process.kill_window import expected_save_s, expected_window_warning, kill_window, resolve_pool
from gpt2.root import layout
from gpt2.train.memory import estimate_multi_rank_bytes, estimate_step_bytes
from gpt2.train.session import check_batch_shape
from gpt2.train.step import MemorySettings, configured, memory_candidates, micro_batch_candidates
from gpt2.weights.init import fetched

ASSUMED_MFU = 0.4
"""Model FLOPs utilization assumed for the time estimate (llm.c reaches ~40-50% on H100s)."""
EVAL_FLOPS_FRACTION = 1 / 3  # a forward pass is a third of forward + backward
CHECKPOINT_BYTES_PER_PARAM = 4 + 8  # fp32 weights + AdamW's two fp32 moments (gpt2.checkpoint.store)
SESSION_HOURS = 9.0
"""The session limit the plan counts sessions against: Kaggle's 9 h (Colab's free tier
gives up to 12 h, usually less); `gpt2 plan --session-hours` sets another."""
COUNTED = "training steps + validation passes (forward only)"
NOT_COUNTED = "start-up, compilation, micro-batch probe, checkpoint writes, HellaSwag during training, data stage"


def model_size(config: Config) -> tuple[int, int]:
    """(parameters, training FLOPs per token), from the model's shapes (gpt2.model.parameter_count)."""
    return (parameter_count(config.model, non_embedding=False),
            training_flops_per_token(config.model, parameter_count(config.model)))


def count_every(steps: int, every: int) -> int:
    """Events at every `every`-th step and at the end (once if the end is one)."""
    return steps // every + (1 if steps % every else 0)


def expected_micro_batch(seqs_per_rank: int, fits: Callable[[int], bool]) -> int:
    """What gpt2.train.step.find_micro_batch settles on when `fits` says what
    fits (the same candidates, in the same order). 0 when not even 1 fits."""
    return next((b for b in micro_batch_candidates(seqs_per_rank) if fits(b)), 0)


def expected_fit(seqs_per_rank: int, fits: Callable[[int, MemorySettings], bool], shard_optimizer: bool | str,
                 recompute: bool | str, gpus: int) -> tuple[int, MemorySettings]:
    """What gpt2.train.step.find_memory_fit settles on (the same candidates,
    in the same order): (0, the last settings tried) when nothing fits."""
    tried = list(memory_candidates(seqs_per_rank, shard_optimizer, recompute, gpus))
    return next(((b, s) for b, s in tried if fits(b, s)), (0, tried[-1][1]))


def _source(config: Config, list_source: bool) -> tuple[SourceFiles, str]:
    """The data source with its size: measured (built-in), listed (local, or
    remote with `list_source`), else estimated from the tokens training reads."""
    src = config.data.source
    if src.startswith(BUILTIN_PREFIX):
        nbytes = sum(len(json.dumps(d, ensure_ascii=False).encode()) + 1 for d in builtin_documents(src))
        return SourceFiles(url=src, format="json", files=(src,), sizes=(nbytes,), builtin=True), "measured"
    if list_source or not is_remote(src):
        try:
            listed = resolve_source(config.data)
            if listed.sizes and all(listed.sizes):
                return listed, "listed"
        except SourceError:
            if list_source:
                raise
    fmt = file_format(src) or "parquet"
    tokens = config.train.max_steps * config.train.total_batch_tokens + config.data.val_tokens
    nbytes = int(tokens * disk.SOURCE_BYTES_PER_TOKEN[fmt])
    return SourceFiles(url=src, format=fmt, files=(src,), sizes=(nbytes,)), "estimated from the tokens trained"


def _mfu(config: Config, g: Gpu, given: float | None) -> tuple[float, str]:
    """The MFU the plan uses, and where it comes from: given (--mfu), measured
    on this GPU (gpt2.cost.measured), else ASSUMED_MFU."""
    if given is not None:
        return given, "given (--mfu)"
    found = measured_mfu(g, config.preset)
    if found is not None:
        return found
    why = f"assumed: no measurement of {config.preset} on {g.name} in the GPU records"
    if g.peak_flops is None:  # T4, V100, P100: fp16 with loss scaling, where no published run of this model is known
        why += (f"; optimistic on a card without bf16 such as the {g.name}: expect it slower; gpt2 preflight "
                "measures it in minutes")
    return ASSUMED_MFU, why


def plan_precision(config: Config, g: Gpu) -> tuple[str, str]:
    """(precision, why) the run trains in on `g`, as gpt2.train.precision decides it on the card."""
    setting = config.train.precision
    if setting == "bf16" and g.peak_flops is None:
        raise PlanError(f"train.precision=bf16 but the {g.name} has no native bf16: set train.precision=fp16 "
                        "(with loss scaling) or auto")
    if setting != "auto":
        return setting, f"train.precision={setting}"
    if g.precision == "bf16":
        return "bf16", f"auto: the {g.name} has native bf16"
    return "fp16", f"auto: the {g.name} has no native bf16"


def sessions(hours: float, steps: int, checkpoint_every: int, session_hours: float) -> dict[str, Any]:
    """What a session limit (a free tier's 9 h) means for a run of `hours`: how many
    sessions, and the most a session that ends between checkpoints redoes (resume
    continues from the newest checkpoint: train.checkpoint_every steps at most)."""
    if session_hours <= 0:
        raise PlanError(f"--session-hours must be positive, got {session_hours}")
    step_hours = hours / steps if steps else 0.0
    return {"session_hours": session_hours, "sessions": max(1, math.ceil(hours / session_hours)),
            "steps_per_session": int(session_hours / step_hours) if step_hours else steps,
            "redo_hours_per_session": min(checkpoint_every, steps) * step_hours,
            # A session limit kills without a SIGTERM checkpoint: this interval redoes at most a quarter hour.
            "checkpoint_every_quarter_hour": max(1, int(0.25 / step_hours)) if step_hours else checkpoint_every}


def make_plan(config: Config, gpu_name: str, gpus: int = 1, price_per_hour: float | None = None,
              mfu: float | None = None, list_source: bool = False,
              session_hours: float = SESSION_HOURS) -> dict[str, Any]:
    """The plan as a JSON-able dict (bytes in bytes, time in hours, cost in the
    price's currency, None without a price)."""
    if gpus < 1:
        raise PlanError(f"--gpus must be at least 1, got {gpus}")
    mfu, mfu_from = _mfu(config, gpu(gpu_name), mfu)
    if not 0 < mfu <= 1:
        raise PlanError(f"the assumed MFU must lie in (0, 1], got {mfu}")
    if price_per_hour is not None and price_per_hour < 0:
        raise PlanError(f"--price-per-hour must not be negative, got {price_per_hour}")
    g = gpu(gpu_name)
    precision, precision_why = plan_precision(config, g)
    # train.max_steps=epoch: the root's manifest says how many, else an assumption the plan names.
    steps, steps_from, steps_note = planned_steps(config)
    config = config.model_copy(update={"train": config.train.model_copy(update={"max_steps": steps})})
    t, m = config.train, config.model
    n_params, flops_per_token = model_size(config)
    seqs_per_rank = check_batch_shape(config, gpus)

    # Micro-batch: the setting, or what the search is expected to find fits.
    memory_bytes = int(g.memory_gib * (1 << 30))

    def step_bytes(batch: int, saving: MemorySettings) -> int:
        return estimate_step_bytes(n_params, m.n_layer, m.n_embd, m.vocab_size, batch * m.block_size,
                                   gpus if saving.shard_optimizer else 1, saving.recompute,
                                   t.optimizer, precision) + estimate_multi_rank_bytes(gpus)

    auto, rt = t.micro_batch_size == "auto", config.runtime
    if auto:
        micro, saving = expected_fit(seqs_per_rank, lambda b, s: step_bytes(b, s) <= memory_bytes,
                                     rt.shard_optimizer, rt.recompute, gpus)
    else:  # as in training: `auto` savers are searched beside an `auto` micro-batch only
        micro, saving = t.micro_batch_size, configured(rt.shard_optimizer, rt.recompute, gpus)
    if not auto and seqs_per_rank % micro:
        raise PlanError(f"train.micro_batch_size={micro} does not divide the {seqs_per_rank} sequences each of "
                        f"{gpus} GPU(s) gets per step; choose a divisor of {seqs_per_rank} or auto")

    # Checkpoints: every checkpoint_every steps and at the end; the newest
    # keep_checkpoints stay, plus the one being written before the oldest goes.
    checkpoints = count_every(t.max_steps, t.checkpoint_every)
    kept = min(t.keep_checkpoints, checkpoints)
    checkpoint_bytes = n_params * CHECKPOINT_BYTES_PER_PARAM
    local_root = layout.local_root(config) is not None

    # Disk: the data stage's peak (gpt2.data.disk), and on the GPU node the
    # shards (in the root, or cached from a remote one), the local copy each
    # save writes before the root's (gpt2.checkpoint.staging) and, for a
    # local root, the checkpoints.
    source, size_from = _source(config, list_source)
    data = disk.plan(config, source)
    shard_bytes = int(data.tokens * disk.TOKEN_BYTES)
    node_checkpoint_bytes = (min(kept + 1, checkpoints) * checkpoint_bytes if local_root else 0) + checkpoint_bytes

    # The SIGTERM checkpoint against the kill window of where it trains (runtime.pool).
    window = kill_window(gpus > 1 or rt.nnodes > 1, rt.pool)
    window_warning = expected_window_warning(checkpoint_bytes, not local_root, window, t.checkpoint_every)

    # Time: training steps plus the validation passes, at the assumed MFU.
    tokens = t.max_steps * t.total_batch_tokens
    validations = count_every(t.max_steps, t.eval_every)
    flops = flops_per_token * (tokens + EVAL_FLOPS_FRACTION * validations * t.val_steps * t.total_batch_tokens)
    peak = g.peak_for(precision)
    flops_per_second = peak * gpus * mfu
    hours = flops / flops_per_second / 3600
    result = {
        "preset": config.preset,
        "gpu": g.name,
        "gpus": gpus,
        "peak_flops": peak,
        "peak_bf16_flops": g.peak_flops,
        "peak_fp16_flops": g.peak_fp16_flops,
        "precision": precision,
        "precision_why": precision_why,
        "gpu_memory_gib": g.memory_gib,
        "assumed_mfu": mfu,
        "mfu_from": mfu_from,
        "params": n_params,
        "flops_per_token": flops_per_token,
        "steps": t.max_steps,
        "steps_from": steps_from,
        "steps_note": steps_note,
        "total_batch_tokens": t.total_batch_tokens,
        "tokens": tokens,
        "micro_batch_size": micro or None,
        "micro_batch_auto": auto,
        "accumulation_steps": seqs_per_rank // micro if micro else None,
        "gpu_memory_bytes_estimated": step_bytes(micro or 1, saving),
        "shard_optimizer": saving.shard_optimizer,
        "recompute": saving.recompute,
        "checkpoints": checkpoints,
        "checkpoints_kept": kept,
        "checkpoint_bytes": checkpoint_bytes,
        "checkpoints_on_gpu_node": local_root,
        "pool": resolve_pool(rt.pool),
        "kill_window_s": window[0],
        "kill_window_from": window[1],
        "checkpoint_save_s_expected": expected_save_s(checkpoint_bytes, not local_root),
        "checkpoint_window_warning": window_warning,
        "data_tokens": data.tokens,
        "data_tokens_estimated": data.estimated,
        "source_size": size_from,
        "keep_intermediate": config.runtime.keep_intermediate,
        "disk_data_vm_bytes": sum(data.needs.values()),
        "shard_bytes": shard_bytes,
        "disk_gpu_node_bytes": shard_bytes + node_checkpoint_bytes,
        "validation_passes": validations,
        "tokens_per_second": flops_per_second / flops_per_token,
        "hours": hours,
        "gpu_hours": hours * gpus,
        "price_per_hour": price_per_hour,
        "cost": hours * price_per_hour if price_per_hour is not None else None,
        **sessions(hours, t.max_steps, t.checkpoint_every, session_hours),
        "counted": COUNTED,
        "not_counted": NOT_COUNTED,
    }
    if t.init_from != SCRATCH:  # a fine-tune reads its weights first, once, into the root (gpt2.weights.init)
        result["init"] = {"source": t.init_from, "bytes": n_params * 4, "fetched": fetched(config)}
    if config.runtime.gpu_pools:  # without a ladder the plan keeps exactly its keys
        result["ladder"] = ladder_plan.rungs(config, result, price_per_hour)
    return result
