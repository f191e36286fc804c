"""Whether a run compiles (runtime.compile), and what a failed compile turns into.

`choose_compile` decides before anything compiles, from what the device is
(`DeviceCaps`, gpt2.train.precision):

    auto  on CUDA from compute capability 7.0  -> compiled: inductor's Triton kernels pay for their compile time
    auto  on older CUDA (P100: 6.0)            -> eager, with one warning: Triton, torch.compile's GPU compiler,
                                                  needs 7.0 (torch's own check, torch.utils._triton.has_triton)
    auto  on a CPU or MPS                      -> eager
    true  on older CUDA                        -> CompileError: one line naming the card and what to set
    true, false                                -> as set

A card that passes may still fail to compile (Triton missing, a compiler bug for
this model): the first compiled step tells (`warm_up_or_fall_back`: the trainer's
warm-up, the preflight's first step). Under `auto` its exception turns the run
eager with one warning naming the device and the exception, and rank 0 records
why beside the compiled program's key, `runs/<run>/compile/<key>.failed.json`
(gpt2.train.compile_cache): the attempts that follow, and the training after a
preflight whose compile check failed, start eagerly without trying again. A
record only ever turns compiling off, so one planted in the root costs speed,
never a result; another torch, card or precision is another key, tried afresh.
Under `true` the failure is a CompileError.

A run that fell back trains exactly what an eager run trains: the warm-up
changes no weight, no optimizer state and no RNG state (gpt2.train.step.warm_up).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv, all_reduce
from gpt2.root import layout, storage
from gpt2.train import compile_cache
from gpt2.train.parallel import wrap_ddp
from gpt2.train.precision import DeviceCaps, device_caps, where

log = logging.getLogger(__name__)

INDUCTOR_CAPABILITY = (7, 0)
"""The oldest CUDA compute capability Triton compiles for (torch raises GPUTooOldForTriton below it)."""


class CompileError(UserError, RuntimeError):
    """runtime.compile=true where compiling fails; the message names the device and what to set."""


@dataclass(frozen=True)
class CompileChoice:
    """What runtime.compile resolved to on a device: `compile` or not, and why;
    `fallback`: `auto` runs eagerly where it would compile (warned once)."""

    compile: bool
    why: str
    fallback: bool = False


def resolve_compile(setting: bool | str, device: torch.device) -> bool:
    """What `runtime.compile` asks for on this kind of device: `auto` compiles on
    CUDA only, where inductor's kernels pay for their compile time; CPU and MPS
    runs stay eager. Whether the card itself compiles is `choose_compile`'s."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def choose_compile(setting: bool | str, caps: DeviceCaps) -> CompileChoice:
    """runtime.compile on a device with `caps`; raises CompileError for `true` on a
    CUDA card Triton does not compile for."""
    if setting == "auto" and caps.type != "cuda":
        return CompileChoice(False, f"auto: eager on {caps.name} (auto compiles on CUDA only)")
    if caps.type == "cuda" and (caps.capability or INDUCTOR_CAPABILITY) < INDUCTOR_CAPABILITY:
        old = f"{where(caps)} is older than 7.0, the oldest Triton (torch.compile's GPU compiler) compiles for"
        if setting is True:
            raise CompileError(f"runtime.compile=true but {old}: set runtime.compile=false or auto")
        if setting == "auto":
            return CompileChoice(False, f"auto: {old}: training eagerly", fallback=True)
    if setting == "auto":
        return CompileChoice(True, f"auto: {where(caps)} compiles")
    return CompileChoice(bool(setting), f"runtime.compile={str(bool(setting)).lower()}")


def decide(setting: bool | str, device: torch.device) -> CompileChoice:
    """`choose_compile` for this device; an `auto` that stays eager where it
    would compile is said once, as a warning."""
    choice = choose_compile(setting, device_caps(device))
    if choice.fallback:
        log.warning("runtime.compile=%s", choice.why)
    return choice


def compiled(raw: GPT, config: Config, device: torch.device) -> torch.nn.Module:
    """The model the steps run: compiled once, with static shapes (every step
    has the same micro-batch shape, so dynamic kernels would only be slower)."""
    return _compile(raw, config, device) if resolve_compile(config.runtime.compile, device) else raw


def _compile(raw: GPT, config: Config, device: torch.device) -> torch.nn.Module:
    log.info("runtime.compile=%s: torch.compile on %s; the first step includes the compilation",
             config.runtime.compile, device)
    return torch.compile(raw, dynamic=False)


@dataclass
class Built:
    """The model the steps run (inside DDP with several ranks) and its compiled
    program's travel (None: eager from the start, nothing to load or save)."""

    model: torch.nn.Module
    travel: compile_cache.Travel | None
    compiling: bool
    """The model is compiled (False after a fallback, or where a failure was recorded)."""
    fallback: str | None = None
    """Why `auto` trains eagerly where it would compile: the device, or how compiling failed."""


def _wrap(model: torch.nn.Module, raw: GPT, env: DistEnv) -> torch.nn.Module:
    return wrap_ddp(model, raw, env) if env.is_distributed else model


def eager(raw: GPT, env: DistEnv, travel: compile_cache.Travel | None = None, fallback: str | None = None) -> Built:
    """The eager model the steps run."""
    return Built(_wrap(raw, raw, env), travel, False, fallback)


def verdict_url(config: Config, fields: dict) -> str:
    return storage.join(layout.run_dir(config), "compile", f"{compile_cache.key_of(fields)}.failed.json")


def recorded_failure(config: Config, fields: dict) -> str | None:
    """Why compiling this key failed before (an attempt, the preflight); None when it did not."""
    record = storage.read_record(verdict_url(config, fields))
    return str(record.get("reason", "unknown")) if isinstance(record, dict) else None


def record_failure(config: Config, fields: dict, reason: str) -> str:
    """Rank 0: why compiling failed, beside the key, for the attempts that follow. Never raises."""
    url = verdict_url(config, fields)
    try:
        storage.write_record(url, {"key": compile_cache.key_of(fields), "fields": fields, "reason": reason})
    except Exception as err:  # noqa: BLE001 - without it the next attempt only tries again
        log.warning("why compiling failed was not recorded at %s (%s: %s)", url, type(err).__name__, err)
    return url


def build(raw: GPT, config: Config, env: DistEnv, micro_batch: int, recompute: bool, precision: str) -> Built:
    """The model as runtime.compile and the device decide (raises CompileError);
    under `auto`, eager where compiling this key failed before. The run's
    compiled program is loaded when an attempt saved it (gpt2.train.compile_cache)."""
    choice = decide(config.runtime.compile, env.device)
    if not choice.compile:
        return eager(raw, env, fallback=choice.why if choice.fallback else None)
    fields = compile_cache.key_fields(config, env.device, micro_batch, recompute, env.world_size, precision)
    before = recorded_failure(config, fields) if config.runtime.compile == "auto" else None
    if before is not None:
        why = f"auto: training eagerly on {where(device_caps(env.device))}: compiling failed there before ({before})"
        log.warning("runtime.compile=%s; delete %s to try again", why, verdict_url(config, fields))
        return eager(raw, env, compile_cache.Travel(fields, "failed", 0.0), why)
    travel = compile_cache.Travel.begin(config, env.device, micro_batch, recompute, env.world_size, precision)
    return Built(_wrap(_compile(raw, config, env.device), raw, env), travel, True)


def failure_reason(err: BaseException) -> str:
    """The exception a compiler raised, in one line: the innermost one torch wrapped."""
    for _ in range(8):
        inner = getattr(err, "inner_exception", None) or err.__cause__
        if not isinstance(inner, BaseException) or inner is err:
            break
        err = inner
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first}"[:300]


def warm_up_or_fall_back(built: Built, raw: GPT, config: Config, env: DistEnv,
                         warm: Callable[[torch.nn.Module], None]) -> Built:
    """The first compiled step: `warm(model)` (nothing to do eagerly). Where it
    raises (out of memory aside: the caller's), on any rank, `auto` goes on with
    the eager model and one warning, rank 0 recording why; `true` raises CompileError."""
    if not built.compiling:
        return built
    error = None
    try:
        warm(built.model)
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever the compiler raised: the eager model runs
        error = err
    failed = all_reduce(torch.tensor([float(error is not None)], device=env.device), env, op="max")
    if not failed.item():
        return built
    reason = failure_reason(error) if error is not None else "compiling failed on another rank"
    device = where(device_caps(env.device))
    if config.runtime.compile is True:
        raise CompileError(f"runtime.compile=true but compiling for {device} failed ({reason}): "
                           "set runtime.compile=false or auto") from error
    error = None  # its traceback holds the compiled model: gone with it, the failed DDP's gradient hooks go too
    fields = built.travel.fields
    url = record_failure(config, fields, reason) if env.is_main else verdict_url(config, fields)
    built.travel.status = "failed"
    why = f"auto: compiling for {device} failed ({reason}): training eagerly"
    log.warning("runtime.compile=%s; recorded at %s, so the attempts that follow start eagerly", why, url)
    return eager(raw, env, built.travel, why)
