"""One training run in this process: join the process group, open the
session (data, model, resumed state), run the loop, and turn SIGTERM into a
checkpoint and `Preempted`. The command line is `python -m gpt2.train`
(gpt2/train/__main__.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from gpt2.config.tree import Config
from gpt2.data.epoch import with_resolved_steps
from gpt2.eval.core.fetch import for_training
from gpt2.ladder.rungs import stop_if_left
from gpt2.process import collector
from gpt2.process.distributed import STARTUP_TIMEOUT_S, distributed
from gpt2.train.attempts import Attempt, settle
from gpt2.train.loop import Loop
from gpt2.train.preemption import SigtermGuard
from gpt2.train.progress import Progress, StepInfo
from gpt2.train.session import TrainingError, open_session, resolve_init, take_lease
from gpt2.train.startup import StartupParts

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what schedulers expect from a stopped job


class Preempted(TrainingError):
    """SIGTERM arrived; a checkpoint was written and the run can be resumed."""


@dataclass(frozen=True)
class TrainResult:
    run_name: str
    checkpoint: str | None
    steps: int
    resumed_from_step: int
    final_train_loss: float | None
    final_val_loss: float | None
    tokens_per_second: float
    mlflow_run_id: str | None
    micro_batch_size: int
    world_size: int
    warmup_s: float | None = None
    """This session's first step in seconds: warm-up and, with runtime.compile,
    the compilation; kept out of tokens_per_second (None: no step ran)."""
    shard_optimizer: bool = False
    """ZeRO-1 was on (runtime.shard_optimizer as resolved)."""
    recompute: bool = False
    """Activation recomputation was on (runtime.recompute as resolved)."""
    bill: dict | None = None
    """What the run cost so far, every attempt included (gpt2.train.bill.training_bill)."""
    compile_cache: str | None = None
    """The compiled program (gpt2.train.compile_cache): `loaded` from the run (a warm start), `saved` to it,
    `absent` or `refused` (compiled cold, not saved), `failed` (compiling failed under runtime.compile=auto:
    trained eagerly, gpt2.train.compile_choice); None without runtime.compile."""
    spikes: dict | None = None
    """Loss spikes of the run so far, by what was done (train.on_spike): `warned`, `skipped`,
    `rollbacks` (gpt2.train.spikes); the rolled-back timelines' own warnings and skips are not counted."""
    precision: str | None = None
    """train.precision as resolved on this device: bf16, fp16 or fp32 (gpt2.train.precision)."""
    skipped_steps: int | None = None
    """Optimizer steps fp16's loss scaler skipped for an inf or nan gradient, over the whole run
    (its checkpoints keep the count); None without a loss scaler (bf16, fp32)."""

    def to_dict(self) -> dict:
        return asdict(self)


class _Warmup:
    """Progress hook for the start-up: logs the first step's time once, as
    perf/warmup_s (the per-step numbers then show steady-state speed, not the
    compilation), saves the compiled program, and records the start-up's
    parts (gpt2.train.startup) once a second step says what was compilation."""

    def __init__(self, progress: Progress | None, compiling: bool, clock: StartupParts, attempt: Attempt):
        self.progress, self.compiling, self.loop, self.logged = progress, compiling, None, False
        self.clock, self.attempt, self.steady = clock, attempt, False

    def __call__(self, info: StepInfo) -> None:
        first = self.loop.throughput.first if self.loop else None
        if first is not None and not self.logged:
            self.logged = True
            log.info("first step took %.1fs (warm-up%s)", first[1], ", compilation" if self.compiling else "")
            self.loop.tracker.log_metrics({"perf/warmup_s": first[1]}, step=info.step)
            self.clock.first_step(first[1], time.time())
            self.attempt.startup(self.clock.as_dict(), write=False)  # written with the first step's record
            if self.loop.s.compile_cache is not None:  # for the next attempt, on any machine
                self.loop.s.compile_cache.after_first_step(self.loop.cfg, self.loop.s.env.is_main)
        elif first is not None and not self.steady and info.tokens_per_second:
            self.steady = True
            self.clock.steady_step(self.loop.cfg.train.total_batch_tokens / info.tokens_per_second, self.compiling)
            parts = self.clock.as_dict()
            self.attempt.startup(parts)
            self.loop.tracker.log_metrics({f"startup/{k}": v for k, v in parts.items()}, step=info.step)
        if self.progress is not None:
            self.progress(info)


def _warmup_s(loop: Loop) -> float | None:
    return loop.throughput.first[1] if loop.throughput.first else None


def train(config: Config, fresh: bool = False, progress: Progress | None = None,
          parent_run_id: str | None = None, tags: dict | None = None) -> TrainResult:
    """Train `config` to `train.max_steps`, resuming from its newest checkpoint
    (unless `fresh`). Raises TrainingError (NaN loss, OOM, bad batch shape);
    after SIGTERM, whatever the replaced SIGTERM handler raises, else
    Preempted (gpt2.train.preemption). The last good checkpoint is always kept."""
    config = with_resolved_steps(config)  # `epoch` as a number: the run's name and the loop need one
    guard, started = SigtermGuard(interrupts=True), time.time()
    clock = StartupParts(entered=started)
    rt = config.runtime
    with distributed(rt.device, rt.collective_timeout_s, STARTUP_TIMEOUT_S + rt.lease_wait_s) as env, \
            guard.installed():
        config = resolve_init(config, env)  # train.init_from's weights in the root, their sha256 in the name
        for_training(config, fetching=False)  # eval.core_every's bundle in the root, or refused before step 1
        with clock.part("lease"):
            lease = take_lease(config, env, (tags or {}).get("prefect.flow_run_id"))
            stop_if_left(config, lease, (tags or {}).get("prefect.flow_run_id"))  # gpt2.ladder: a rung left
        # gpt2.train.attempts: what this attempt cost, on which pool
        attempt = Attempt.begin(config, env, lease, started, (tags or {}).get("prefect.work_pool"))
        try:
            session = open_session(config, env, fresh, lease, clock)
            attempt.precision(session.precision.name)
            attempt.resumed(session.start_step, config.train.max_steps)
            warmup = _Warmup(attempt.progress(progress), session.compiled, clock, attempt)
            loop = warmup.loop = Loop(session, warmup, parent_run_id, tags, stop=guard, attempt=attempt)
            collector.started()  # the trainer's start is over (python -m gpt2.train paused the collector)
            outcome = loop.run()
        except BaseException as err:
            attempt.end("error", f"{type(err).__name__}: {err}")
            raise
        finally:
            if lease is not None:
                lease.release()
        attempt.end("preempted" if outcome.preempted else "done")
        bill = settle(config, env, outcome.mlflow_run_id, outcome.steps, "KILLED" if outcome.preempted else "FINISHED")
        if outcome.preempted:
            guard.hand_on()  # the checkpoint is written: an orchestrator's own handling may run now
            raise Preempted(f"stopped by {guard.why} after step {outcome.steps}; checkpoint {outcome.checkpoint}; "
                            "rerun the same command to resume")
        return TrainResult(
            run_name=outcome.run_name, checkpoint=outcome.checkpoint, steps=outcome.steps,
            resumed_from_step=session.start_step, final_train_loss=outcome.train_loss,
            final_val_loss=outcome.val_loss, tokens_per_second=outcome.tokens_per_second,
            mlflow_run_id=outcome.mlflow_run_id, micro_batch_size=session.micro_batch,
            world_size=env.world_size, warmup_s=_warmup_s(loop),
            shard_optimizer=session.memory.shard_optimizer, recompute=session.memory.recompute, bill=bill,
            compile_cache=session.compile_cache.status if session.compile_cache else None,
            spikes=outcome.spikes, precision=session.precision.name, skipped_steps=outcome.skipped_steps,
        )
