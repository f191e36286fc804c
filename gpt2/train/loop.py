"""The training loop: steps, validation, samples, checkpoints, metrics.

Only rank 0 logs metrics and reports progress; every rank takes part in the
steps, the validation passes and the checkpoints (each writes its own share
of the optimizer state, gpt2.checkpoint.writer), and all ranks agree on
when to stop (SIGTERM on any rank stops all of them after the same step).
With several ranks the stop and lease flags ride on each step's loss
all-reduce rather than a collective of their own; a signal arriving after
that point is acted on one step later, on every rank alike. A stop agreed at
a step skips that step's validation, in-loop scores and samples: the checkpoint
comes first, inside the kill window.

A failure one rank survives rides on the next step's flag all-reduce as a
third flag (gpt2.train.rank_failures); one inside a step's collectives reaches
the others through the c10d store (gpt2.train.failure_board).

Host-device syncs per step: the step's own one (its numbers, read after the
optimizer step is queued); the `synchronize` calls timing it then find the
device idle.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict

import torch

from gpt2.checkpoint.lease import LeaseLost
from gpt2.checkpoint.staging import staging_dir
from gpt2.checkpoint.writer import CheckpointWriter
from gpt2.config.identity import train_fingerprint
from gpt2.process.distributed import any_rank
from gpt2.root import layout
from gpt2.tracking.tracker import Tracker
from gpt2.train import memory, mlflow_run, spike_actions
from gpt2.train.checkpoint_state import checkpoint_state
from gpt2.train.failure_board import FailureBoard
from gpt2.train.in_loop import scorers
from gpt2.train.optim import lr_at, set_lr
from gpt2.train.outcome import Outcome
from gpt2.train.progress import Progress, StepInfo
from gpt2.train.rank_failures import RankFailures
from gpt2.train.report import log_loss_curve, log_samples
from gpt2.train.restore import rng_state
from gpt2.train.session import Session, TrainingError
from gpt2.train.spikes import Spikes
from gpt2.train.step import evaluate, train_step_with_flags, unwrapped
from gpt2.train.throughput import Throughput, mfu, now, peak_flops, synchronize

log = logging.getLogger(__name__)


def _every(done: int, interval: int, last: int) -> bool:
    return done % interval == 0 or done == last


class Loop:
    def __init__(self, session: Session, progress: Progress | None, parent_run_id: str | None,
                 tags: dict | None, stop, attempt=None) -> None:
        """`attempt`: this attempt's record (gpt2.train.attempts.Attempt), told of every spike."""
        self.s, self.cfg, self.progress, self.stop = session, session.config, progress, stop
        self.attempt = attempt
        self.run_name, self.run_dir = layout.run_name(self.cfg), layout.run_dir(self.cfg)
        state = session.resumed_state
        self.history = state.get("history", {"train": [], "val": []})
        self.train_loss, self.val_loss = state.get("train_loss"), state.get("val_loss")
        self.spikes = Spikes.of_run(self.cfg.train, state)
        # Every rank writes its share of each checkpoint; rank 0 commits it and reports its timings.
        self.writer = CheckpointWriter(self.run_dir, self.cfg.train.keep_checkpoints, session.resumed_url,
                                       fence=session.lease.check if session.lease else None,
                                       staging=staging_dir(self.cfg),
                                       metrics=(lambda values, step: self.tracker.log_metrics(values, step))
                                       if session.env.is_main else None)
        self.saved_step = session.start_step
        self.throughput = Throughput()
        self.saved_tps = state.get("tokens_per_second", 0.0)
        self.peak = peak_flops(session.env.device, session.precision.name if session.precision else "bf16")
        self.flops_per_token = session.raw_model.flops_per_token()
        self.log_every = max(1, self.cfg.train.max_steps // 100)
        self.data_wait = 0.0  # seconds the steps waited for their batches since the last log line
        self.failures = RankFailures(session.env, self.writer)
        self.in_loop = scorers(self.cfg, session.env, session.ctx.amp, session.micro_batch, self.failures.survive)
        self.board = FailureBoard.for_group(session.env)  # watches from run() on
        all_tags = {"stage": "train", "train_fingerprint": train_fingerprint(self.cfg), **(tags or {})}
        held = session.lease.still_held if session.lease else None
        self.tracker = Tracker(self.cfg, self.run_name,
                               run_id=mlflow_run.run_to_reopen(self.run_dir, state) if session.env.is_main else None,
                               parent_run_id=parent_run_id, tags=all_tags,
                               enabled=session.env.is_main, system_metrics=True,
                               fence=held,  # lost: no late sends
                               on_new_run=mlflow_run.recorder(self.run_dir, held))
        self.tracker.requeue(state.get("tracking_backlog") or [])  # what the killed attempt never sent
        if session.env.is_main and not state:
            self.tracker.log_params(self.cfg.model_dump(mode="json"))
            self.tracker.log_params({"resolved.runtime": asdict(session.memory)})  # what `auto` chose
            self.tracker.log_params({"resolved.train.precision": getattr(session.precision, "name", None)})
            self.tracker.log_dict(self.cfg.model_dump(mode="json"), "config.json")

    def run(self) -> Outcome:
        status, preempted = "FAILED", False
        self.board.start()
        try:
            with self.board.watching(lambda err: err is self.failures.agreed, self._steps_done):
                preempted = self._train()
            if self.s.env.is_main and self.history["train"]:
                log_loss_curve(self.tracker, self.history, self.run_name, self.spikes.events)
            status = "KILLED" if preempted else "FINISHED"
        except LeaseLost:
            status = None  # the MLflow run belongs to the new trainer now: leave its status alone
            raise
        finally:
            self.s.loader.source.close()
            try:  # whatever happened, the checkpoint being written is completed first
                last = self._last_checkpoint(close=True)
            finally:
                self.board.close()  # after the others read this rank's failure, if it posted one
                self.tracker.close(status)
        return Outcome(self.run_name, last, self._steps_done(), self.train_loss, self.val_loss,
                       self.throughput.tokens_per_second or self.saved_tps, self.tracker.run_id, preempted,
                       self.spikes.counts(), self.s.ctx.scaler.skipped if self.s.ctx.scaler is not None else None)

    def _train(self) -> bool:
        """The steps, until the last or an agreed stop (True: preempted)."""
        if self.spikes.rolls_back and self.s.resumed_url is None:
            self._save(0)  # a spike before the first checkpoint goes back to the start
        done = self.s.start_step
        while done < self.cfg.train.max_steps:
            done, agreed = self._step(done)  # after a rollback, the checkpoint's step
            self.board.check(done)  # NCCL: a peer's failure aborted the step's collectives
            # One process reads its flags now; several act on what the step's all-reduce carried.
            stop, lost, failed = agreed if self.s.env.is_distributed else self._flags()
            if failed:
                self.failures.raise_agreed(done)
            if lost:
                raise self.failures.agree(LeaseLost(f"another trainer took over {self.run_dir} during step {done}: "
                                            "stopping without writing"))
            if stop:
                if self.saved_step != done:
                    self._save(done)
                return True
        if any_rank(self.failures.failure is not None, self.s.env):  # after the last step's flags
            self.failures.raise_agreed(self._steps_done())
        return False

    def _last_checkpoint(self, close: bool = False) -> str | None:
        """The newest complete checkpoint, named by rank 0 only (the others
        wait for their share of it, and learn of its failure, all the same)."""
        if self.writer is None:
            return None
        if close:
            self.writer.close()
        last = self.writer.wait()
        return last if self.s.env.is_main else None

    def _flags(self) -> list[bool]:
        """This rank's [stop requested, lease lost, failed]."""
        lease = self.s.lease
        return [self.stop.requested, lease is not None and lease.lost, self.failures.failed()]

    def _steps_done(self) -> int:
        return self.history["train"][-1][0] if self.history["train"] else self.s.start_step

    def _step(self, step: int) -> tuple[int, list[bool]]:
        """Steps done (after a rollback, the step gone back to), and the flags
        of `_flags` as all ranks agreed on them."""
        s, cfg = self.s, self.cfg.train
        lr = lr_at(step, cfg)
        set_lr(s.optimizer, lr)
        # Timed from the batch fetch to the end of the optimizer step (the window
        # nanoGPT and llm.c time, and bench.train_step): tokens/s, MFU and the ETA
        # include waiting for data, which is also reported on its own.
        synchronize(s.env.device)
        t0 = now()
        waited = s.loader.source.wait_seconds
        try:
            batches = s.loader.next_batches()
        except Exception as err:  # noqa: BLE001 - a shard this rank cannot fetch
            self.failures.survive(err, f"fetching the batches of step {step + 1}")
            batches = s.loader.stand_in_batches()
        data_wait = s.loader.source.wait_seconds - waited
        keep = self.spikes.keep_update(step + 1) if self.spikes.skips_updates else None
        try:
            loss, norm, agreed = train_step_with_flags(s.model, s.raw_model, s.optimizer, batches, s.ctx, self._flags,
                                                       keep)
        except torch.OutOfMemoryError as err:
            raise TrainingError(memory.oom_message(self.cfg, s.micro_batch, s.env.device, step + 1, err)) from err
        synchronize(s.env.device)
        dt = now() - t0
        done = step + 1
        stop, lost, failed = agreed  # one process: its own flags, read before the step
        if failed:
            self.failures.raise_agreed(done)
        self.throughput.add(cfg.total_batch_tokens, dt)
        # fp16: a gradient overflow is the loss scaler's to handle (it skipped the update), not a spike.
        overflow = s.ctx.scaler is not None and s.ctx.scaler.overflowed(done, loss)
        if overflow and self.attempt is not None:
            self.attempt.skipped_step(done)
        verdict = None if overflow else self.spikes.last if keep is not None else self.spikes.judge(done, loss, norm)
        spike = verdict is not None and verdict.spike and not lost  # a lost lease: stopping without writing
        if spike and self.spikes.rolls_back:
            return spike_actions.roll_back(self, verdict, done), agreed
        if spike:
            spike_actions.tell(self, self.spikes.event(verdict))
        # The update was dropped (a non-finite step's too, so the weights are intact): no divergence.
        dropped = keep is not None and verdict is not None and verdict.spike
        if not math.isfinite(loss) and not dropped:
            raise self.failures.agree(TrainingError(
                f"loss is {loss} at step {done} of {cfg.max_steps}: training diverged; the last good checkpoint "
                f"is {self._last_checkpoint() or '(none yet)'}; lower train.lr or raise train.warmup_steps"
            ))
        self.train_loss = loss
        self.history["train"].append([done, loss])
        # A stop agreed at this step goes straight to the checkpoint (in the kill window).
        stopping = stop or lost
        val = None if stopping else self._validate(done)
        try:
            self._report(done, loss, lr, norm, cfg.total_batch_tokens / dt, val, data_wait)
        except Exception as err:  # noqa: BLE001 - rank 0's reporting (the progress hook, a status file)
            self.failures.survive(err, f"reporting step {done}")
        if not stopping:
            self._in_loop(done)
        if not stopping and _every(done, cfg.sample_every, cfg.max_steps):
            self._samples(done)
        if not lost and _every(done, cfg.checkpoint_every, cfg.max_steps):
            self._save(done)
        return done, agreed

    def _validate(self, done: int) -> float | None:
        if not _every(done, self.cfg.train.eval_every, self.cfg.train.max_steps):
            return None
        self.val_loss = evaluate(unwrapped(self.s.model), self.s.val, self.s.ctx)
        self.history["val"].append([done, self.val_loss])
        return self.val_loss

    def _report(self, done: int, loss: float, lr: float, norm: float, tps: float, val: float | None,
                data_wait: float) -> None:
        if not self.s.env.is_main:
            return
        per_device = tps / self.s.env.world_size
        util = mfu(self.flops_per_token, per_device, self.peak)
        metrics = {"train/loss": loss, "train/lr": lr, "train/grad_norm": norm, "perf/tokens_per_second": tps,
                   "perf/data_wait_s": data_wait}
        if util is not None:
            metrics["perf/mfu"] = util
        metrics.update(self.s.ctx.scaler.metrics() if self.s.ctx.scaler is not None else {})  # fp16's scaler
        if val is not None:
            metrics["val/loss"] = val
        self.tracker.log_metrics(metrics, step=done)
        remaining = self.cfg.train.max_steps - done
        avg = self.throughput.tokens_per_second
        eta = remaining * self.cfg.train.total_batch_tokens / avg if avg else None
        if self.progress is not None:
            self.progress(StepInfo(done, self.cfg.train.max_steps, loss, lr, norm, tps, util, eta, val, data_wait))
        self.data_wait += data_wait
        if done % self.log_every == 0 or val is not None or done == self.cfg.train.max_steps:
            extra = f" | mfu {100 * util:.1f}%" if util is not None else ""
            extra += f" | val {val:.4f}" if val is not None else ""
            # Waiting for shards, summed since the last line (already inside tok/s: this says how much).
            extra += f" | data wait {self.data_wait:.2f}s" if self.data_wait >= 0.005 else ""
            self.data_wait = 0.0
            log.info("step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s%s",
                     done, self.cfg.train.max_steps, loss, lr, norm, tps, extra)

    def _in_loop(self, done: int) -> None:
        for scorer in self.in_loop:
            metrics = scorer(self.s.raw_model, done)  # every rank scores its share
            if metrics and self.s.env.is_main:
                log.info("%s", scorer.describe(metrics, done))
                self.tracker.log_metrics(metrics, step=done)

    def _samples(self, done: int) -> None:
        if not self.s.env.is_main:
            return
        try:
            log_samples(self.tracker, self.s.raw_model, self.s.env.device, self.cfg.train.seed + done, done)
        except Exception as err:  # noqa: BLE001 - rank 0 alone: the others go on to the next collective
            self.failures.survive(err, f"writing the samples of step {done}")

    def _save(self, done: int) -> None:
        self.saved_step = done
        # The previous write's error, and any failure since the step's flags,
        # stop every rank here: no checkpoint of a step some rank failed in.
        if self.writer is not None:
            try:
                self.writer.wait()
            except Exception as err:  # noqa: BLE001 - raised on every rank just below
                self.failures.survive(err, "writing the previous checkpoint")
        if any_rank(self.failures.failure is not None, self.s.env):
            self.failures.raise_agreed(done)
        url = layout.checkpoint_dir(self.run_dir, done)
        held = self.writer.submit(url, self.s.raw_model, self.s.optimizer,
                                  checkpoint_state(self, done) if self.s.env.is_main else {"step": done},
                                  rng_state(self.s.env.device))
        log.debug("checkpoint %s snapshot took %.3fs; writing in the background", url, held)
        # Send the metrics up to this step now: a run killed later resumes from
        # here, and its MLflow curve then has no hole before the checkpoint.
        # Bounded, and skipped while MLflow is down (the outbox keeps them).
        self.tracker.flush(timeout=10, give_up_on_outage=True)
