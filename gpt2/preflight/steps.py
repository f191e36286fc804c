"""The preflight's training steps: the run's model, micro-batch, optimizer,
compile setting and DDP/ZeRO-1 as the trainer builds them (gpt2.train.session),
stepped on random tokens of the run's shape. They give three checks: memory
(the steps fit; the peak), compile (the first step's extra seconds) and
throughput (tokens/s, MFU, the whole run's projected time and cost)."""

from __future__ import annotations

import logging
import resource
import statistics
import time
from dataclasses import dataclass, field

import torch

from gpt2.config.tree import Config
from gpt2.cost.gpus import gpu_of_device
from gpt2.cost.plan import EVAL_FLOPS_FRACTION, count_every, make_plan, model_size
from gpt2.model import GPT
from gpt2.preflight.report import Failed, Outcome, Skipped, Warned
from gpt2.process.distributed import DistEnv
from gpt2.train import memory
from gpt2.train.compile_choice import Built, CompileError, build, eager, warm_up_or_fall_back
from gpt2.train.optim import make_optimizer
from gpt2.train.precision import LossScaler
from gpt2.train.session import check_batch_shape, choose_micro_batch, resolve_precision
from gpt2.train.step import Batch, StepContext, find_micro_batch, micro_batch_candidates, train_step, warm_up
from gpt2.train.throughput import mfu, peak_flops, synchronize

log = logging.getLogger(__name__)


@dataclass
class StepRun:
    """What the steps measured, or why they stopped (`error`)."""

    micro_batch: int = 0
    accumulation: int = 0
    shard_optimizer: bool = False
    recompute: bool = False
    compiled: bool = False
    first_step_s: float | None = None
    step_s: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    error: str | None = None
    fits: int | None = None
    """After an out-of-memory step: the micro-batch the probe finds fits (None: not searched)."""
    compile_cache: str | None = None
    """The run's compiled program (gpt2.train.compile_cache): loaded, saved, absent or refused."""
    fits_with: str = ""
    """The memory savers that fit needs beyond the configured ones ("" for none)."""
    compile_fallback: str | None = None
    """Why runtime.compile=auto trains eagerly here (gpt2.train.compile_choice); None: it does not."""
    compile_error: str | None = None
    """runtime.compile=true where compiling fails: the one-line error the trainer would stop with."""


def _batches(micro: int, accumulation: int, seq_len: int, vocab: int, device: torch.device) -> list[Batch]:
    """Random tokens of the run's shape (a private generator: the global RNG is untouched)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(accumulation):
        x = torch.randint(0, vocab, (micro, seq_len + 1), generator=gen)
        if device.type == "cuda":
            x = x.pin_memory()
        out.append((x[:, :-1], x[:, 1:]))
    return out


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's peak RSS (Linux: KiB)


def run_steps(config: Config, env: DistEnv, steps: int) -> StepRun:
    """The run's step, built as the trainer builds it, run `steps` + 1 times
    (the first one warms up and compiles, the validation's program too, as
    the trainer's warm-up does); an out-of-memory step ends it with
    `error` set and, for a micro-batch given by hand, the one that fits."""
    rt, out = config.runtime, StepRun()
    seqs = check_batch_shape(config, env.world_size)
    memory.set_cuda_limit(env.device, rt.memory_limit_mb)
    torch.manual_seed(config.train.seed)
    raw = GPT(config.model).to(env.device)
    precision = resolve_precision(config, env.device)
    scaler = LossScaler(env.device.type) if precision.scaled else None
    ctx = StepContext(env, precision.dtype, config.train.grad_clip, rt.memory_limit_mb, scaler)
    try:
        micro, mem = choose_micro_batch(config, raw, seqs, ctx)
    except torch.OutOfMemoryError as err:
        out.error = str(err)
        return out
    out.micro_batch, out.accumulation = micro, seqs // micro
    out.shard_optimizer, out.recompute = mem.shard_optimizer, mem.recompute
    optimizer = make_optimizer(raw, config.train, env.device_type, mem.shard_optimizer)
    # The run's own program: loaded when an attempt saved it, else saved here for the run.
    try:
        built = build(raw, config, env, micro, mem.recompute, precision.name)
    except CompileError as err:
        out.compile_error, built = str(err), eager(raw, env)
    _note(out, built)
    batches = _batches(micro, out.accumulation, config.model.block_size, config.model.vocab_size, env.device)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    try:
        for i in range(steps + 1):
            started = time.perf_counter()
            if i == 0:  # as the trainer compiles: the validation's program travels too
                built = _first_compiled_step(built, raw, optimizer, micro, ctx, config, out)
            train_step(built.model, raw, optimizer, batches, ctx)  # returns the loss: the host has waited for the step
            synchronize(env.device)
            seconds = time.perf_counter() - started
            if i == 0:
                out.first_step_s = seconds
                if built.travel is not None:
                    built.travel.after_first_step(config, env.is_main)
                    out.compile_cache = built.travel.status
            else:
                out.step_s.append(seconds)
    except torch.OutOfMemoryError as err:
        out.error = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    finally:
        out.peak_bytes = _peak_bytes(env.device)
        del built, optimizer, batches
        memory.release(env.device)
    if out.error and config.train.micro_batch_size != "auto":
        out.fits, out.fits_with = _what_fits(config, raw, seqs, ctx)
    return out


def _first_compiled_step(built: Built, raw: GPT, optimizer: torch.optim.Optimizer, micro: int, ctx: StepContext,
                         config: Config, out: StepRun) -> Built:
    """The trainer's warm-up of the compiled model, and its fallback (gpt2.train.compile_choice)."""
    def warm(model: torch.nn.Module) -> None:
        warm_up(model, raw, optimizer, micro, config.model.block_size, ctx)

    try:
        built = warm_up_or_fall_back(built, raw, config, ctx.env, warm)
    except CompileError as err:
        out.compile_error, built = str(err), eager(raw, ctx.env)
    _note(out, built)
    return built


def _note(out: StepRun, built: Built) -> None:
    out.compiled, out.compile_fallback = built.compiling, built.fallback
    out.compile_cache = built.travel.status if built.travel else None


def _what_fits(config: Config, raw: GPT, seqs: int, ctx: StepContext) -> tuple[int | None, str]:
    """The micro-batch the trainer's probe finds fits (None: not even 1), and
    the memory savers it needs set to true where they are `auto` ("" for none)."""
    rt = config.runtime
    probe_ctx = StepContext(ctx.env, ctx.amp, ctx.grad_clip, memory.probe_limit_mb(ctx.env.device, ctx.memory_limit_mb),
                            ctx.scaler)

    def make_opt(shard: bool = False) -> torch.optim.Optimizer:
        return make_optimizer(raw, config.train, ctx.env.device_type, shard)

    try:
        found = find_micro_batch(raw, make_opt, seqs, config.model.block_size, config.model.vocab_size, probe_ctx,
                                 rt.shard_optimizer, rt.recompute)
    except torch.OutOfMemoryError:
        return None, ""
    savers = [f"runtime.{name}=true" for name, on, setting in
              (("shard_optimizer", found.memory.shard_optimizer, rt.shard_optimizer),
               ("recompute", found.memory.recompute, rt.recompute)) if on and setting == "auto"]
    return int(found), " with " + " and ".join(savers) if savers else ""


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def memory_check(config: Config, env: DistEnv, run: StepRun) -> Outcome:
    given = config.train.micro_batch_size
    how = (f"micro-batch {run.micro_batch} ({'auto' if given == 'auto' else 'given'}) x {config.model.block_size} "
           f"tokens, {run.accumulation} accumulation step(s), shard_optimizer={str(run.shard_optimizer).lower()}, "
           f"recompute={str(run.recompute).lower()}, {'compiled' if run.compiled else 'eager'}"
           + (f", DDP over {env.world_size} ranks" if env.is_distributed else ""))
    figures = {"micro_batch": run.micro_batch or None, "accumulation": run.accumulation or None,
               "peak_memory_bytes": run.peak_bytes, "shard_optimizer": run.shard_optimizer,
               "recompute": run.recompute}
    peak = f"peak {'allocated' if env.device.type == 'cuda' else 'process RSS'} {_gib(run.peak_bytes)}"
    if run.error and not run.micro_batch:
        raise Failed(f"no micro-batch fits on {env.device}: {run.error}", **figures)
    if run.error:
        if given == "auto":
            smaller = [b for b in micro_batch_candidates(run.micro_batch * run.accumulation) if b < run.micro_batch]
            hint = (f"set train.micro_batch_size={smaller[0]}" if smaller else
                    "use a smaller model.block_size or model, or a device with more memory")
            raise Failed(f"{how}: the probe's choice ran out of memory in the real step ({run.error}); {hint}",
                         **figures)
        fits = (f"train.micro_batch_size={run.fits} fits{run.fits_with}: set it, or auto" if run.fits else
                "not even a micro-batch of 1 fits: use a smaller model.block_size or model, or more memory")
        raise Failed(f"{how}: out of memory ({run.error}); {fits}", **figures, micro_batch_fits=run.fits)
    return Outcome(f"{how}: {len(run.step_s) + 1} full steps ran, {peak}", figures)


def compile_check(run: StepRun) -> Outcome:
    if run.compile_error:
        raise Failed(run.compile_error)
    if run.compile_fallback:
        raise Warned(f"runtime.compile={run.compile_fallback}, as the run will", compile_cache=run.compile_cache)
    if not run.compiled:
        raise Skipped("runtime.compile is off for this device (auto compiles on CUDA only)")
    steady = statistics.median(run.step_s) if run.step_s else 0.0
    seconds = max(0.0, (run.first_step_s or 0.0) - steady)
    travel = {"loaded": "loaded from the run (an attempt saved it): a warm start",
              "saved": "saved for the run: its first attempt starts warm"}.get(run.compile_cache, "not saved")
    return Outcome(f"the compiled step ran; compilation took ~{seconds:.1f} s (first step {run.first_step_s:.1f} s); "
                   f"the compiled program {travel}",
                   {"compile_s": seconds, "first_step_s": run.first_step_s, "compile_cache": run.compile_cache})


def throughput_check(config: Config, env: DistEnv, run: StepRun, steps_note: str | None) -> Outcome:
    """Tokens/s and MFU of the timed steps, the run's projected time and cost,
    beside what `gpt2 plan` expects for this device: under half warns."""
    if not run.step_s:
        raise Skipped("no step was timed")
    t = config.train
    step_s = statistics.median(run.step_s)
    tok_s = t.total_batch_tokens / step_s
    _, flops_per_token = model_size(config)
    util = mfu(flops_per_token, tok_s / env.world_size, peak_flops(env.device))
    steps = int(t.max_steps)
    # What gpt2.cost.plan counts: the training steps, and each validation pass at a third of a step per batch.
    hours = step_s * (steps + EVAL_FLOPS_FRACTION * count_every(steps, t.eval_every) * t.val_steps) / 3600
    price = config.runtime.price_per_hour
    cost = hours * env.world_size * price if price is not None else None
    figures = {"tokens_per_second": tok_s, "step_s": step_s, "mfu": util, "projected_hours": hours,
               "projected_device_hours": hours * env.world_size, "projected_cost": cost, "steps": steps}
    detail = (f"{tok_s:,.0f} tokens/s ({step_s:.3f} s a step of {t.total_batch_tokens:,} tokens"
              + (f", MFU {util:.1%}" if util is not None else "") + f"); {steps:,} steps"
              + (f" ({steps_note})" if steps_note else "") + f" project to {hours:.2f} h"
              + (f", cost {cost:,.2f}" if cost is not None else ", cost unknown (set runtime.price_per_hour)"))
    plan = _plan(config, env)
    if plan is None:
        return Outcome(detail + "; gpt2 plan has no estimate for this device", figures)
    plan_tok_s = figures["plan_tokens_per_second"] = plan["tokens_per_second"]
    detail += f"; gpt2 plan expects {plan_tok_s:,.0f} tokens/s (at {plan['assumed_mfu']:.1%} MFU, {plan['mfu_from']})"
    if tok_s < plan_tok_s / 2:
        raise Warned(detail + ": under half of the plan. Check that nothing else uses the GPU (nvidia-smi), "
                     "runtime.compile, and the micro-batch (train.micro_batch_size=auto)", **figures)
    return Outcome(detail, figures)


def _plan(config: Config, env: DistEnv) -> dict | None:
    """`gpt2 plan` of this run on this GPU model (None: a device its table does not know)."""
    if env.device.type != "cuda":
        return None
    known = gpu_of_device(torch.cuda.get_device_name(env.device))
    if known is None:
        return None
    return make_plan(config, known.name, gpus=env.world_size)


def step_checks(report, config: Config, env: DistEnv, steps: int, steps_note: str | None) -> StepRun | None:
    """memory, compile and throughput, in that order, from one run of steps."""
    holder: dict[str, StepRun] = {}

    def memory_body() -> Outcome:
        holder["run"] = run_steps(config, env, steps)
        return memory_check(config, env, holder["run"])

    mem = report.check("memory", memory_body)
    run = holder.get("run")
    if mem.status == "fail" or run is None:
        report.skip("compile", "needs a step that fits in memory (see memory)")
        report.skip("throughput", "needs a step that fits in memory (see memory)")
        return run
    report.check("compile", lambda: compile_check(run))
    report.check("throughput", lambda: throughput_check(config, env, run, steps_note))
    return run
