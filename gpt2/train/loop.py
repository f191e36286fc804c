"""The training loop: steps, validation, samples, checkpoints, metrics.

Only rank 0 logs metrics and reports progress; every rank takes part in the
steps, the validation passes and the checkpoints (each writes its own share
of the optimizer state, gpt2.checkpoint.writer), and all ranks agree on
when to stop (SIGTERM on any rank stops all of them after the same step).
With several ranks the stop and lease flags ride on each step's loss
all-reduce rather than a collective of their own; a signal arriving after
that point is acted on one step later, on every rank alike. A stop agreed at
a step skips that step's validation, HellaSwag and samples: the checkpoint
comes first, inside the kill window.

A failure one rank survives (its rank-0-only reporting, a checkpoint write, a
shard fetch, an in-loop evaluation) does not end that rank at once, which
would leave the others blocked in their next collective until its timeout: it
rides on the next step's flag all-reduce as a third flag, every rank stops
after that step, and each ends with the failing rank's message. A failure
inside a step's collectives (an OOM in the forward, an error in validation)
cannot wait for that: the failure board (gpt2.train.failure_board) tells the
other ranks through the c10d store, and they stop at once with its message.

Host-device syncs per step: the step's own one (its numbers, read after the
optimizer step is queued); the `synchronize` calls timing it then find the
device idle.
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from gpt2 import layout
from gpt2.checkpoint.lease import LeaseLost
from gpt2.checkpoint.staging import staging_dir
from gpt2.checkpoint.writer import CheckpointWriter
from gpt2.hellaswag.items import load_items
from gpt2.hellaswag.scorer import evaluate_hellaswag, prepare
from gpt2.identity import train_fingerprint
from gpt2.tracking import Tracker
from gpt2.train.distributed import all_reduce, any_rank, autocast, control_group
from gpt2.train.failure_board import FailureBoard
from gpt2.train.optim import lr_at, set_lr
from gpt2.train.progress import Progress, StepInfo
from gpt2.train.report import loss_curve_png, text_samples
from gpt2.train.session import Session, TrainingError, rng_state
from gpt2.train.step import evaluate, train_step_with_flags
from gpt2.train.throughput import Throughput, mfu, now, peak_flops, synchronize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    run_name: str
    checkpoint: str | None
    steps: int
    train_loss: float | None
    val_loss: float | None
    tokens_per_second: float
    mlflow_run_id: str | None
    preempted: bool = False


def _every(done: int, interval: int, last: int) -> bool:
    return done % interval == 0 or done == last


class Loop:
    def __init__(self, session: Session, progress: Progress | None, parent_run_id: str | None,
                 tags: dict | None, stop) -> None:
        self.s, self.cfg, self.progress, self.stop = session, session.config, progress, stop
        self.run_name, self.run_dir = layout.run_name(self.cfg), layout.run_dir(self.cfg)
        state = session.resumed_state
        self.history = state.get("history", {"train": [], "val": []})
        self.train_loss, self.val_loss = state.get("train_loss"), state.get("val_loss")
        # Every rank writes its share of each checkpoint; rank 0 commits it and reports its timings.
        self.writer = CheckpointWriter(self.run_dir, self.cfg.train.keep_checkpoints, session.resumed_url,
                                       fence=session.lease.check if session.lease else None,
                                       staging=staging_dir(self.cfg),
                                       metrics=(lambda values, step: self.tracker.log_metrics(values, step))
                                       if session.env.is_main else None)
        self.saved_step = session.start_step
        self.throughput = Throughput()
        self.saved_tps = state.get("tokens_per_second", 0.0)
        self.peak, self.flops_per_token = peak_flops(session.env.device), session.raw_model.flops_per_token()
        self.log_every = max(1, self.cfg.train.max_steps // 100)
        self.data_wait = 0.0  # seconds the steps waited for their batches since the last log line
        self.hellaswag_items = None  # loaded on first use; [] once loading failed
        self.failure: Exception | None = None  # this rank's, until the next flag all-reduce carries it
        self.agreed: BaseException | None = None  # raised on every rank alike: not news for the board
        self.board = FailureBoard.for_group(session.env)  # watches from run() on
        all_tags = {"stage": "train", "train_fingerprint": train_fingerprint(self.cfg), **(tags or {})}
        self.tracker = Tracker(self.cfg, self.run_name, run_id=state.get("mlflow_run_id"),
                               parent_run_id=parent_run_id, tags=all_tags,
                               enabled=session.env.is_main, system_metrics=True)
        if session.env.is_main and not state:
            self.tracker.log_params(self.cfg.model_dump(mode="json"))
            self.tracker.log_params({"resolved.runtime": asdict(session.memory)})  # what `auto` chose
            self.tracker.log_dict(self.cfg.model_dump(mode="json"), "config.json")

    def run(self) -> Outcome:
        status, preempted = "FAILED", False
        self.board.start()
        try:
            with self.board.watching(lambda err: err is self.agreed, self._steps_done):
                preempted = self._train()
            self._finish()
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
                       self.throughput.tokens_per_second or self.saved_tps, self.tracker.run_id, preempted)

    def _train(self) -> bool:
        """The steps, until the last or an agreed stop (True: preempted)."""
        for step in range(self.s.start_step, self.cfg.train.max_steps):
            done, agreed = self._step(step)
            self.board.check(done)  # NCCL: a peer's failure aborted the step's collectives
            # One process reads its flags now; several act on what the step's all-reduce carried.
            stop, lost, failed = agreed if self.s.env.is_distributed else self._flags()
            if failed:
                self._raise_failure(done)
            if lost:
                raise self._agree(LeaseLost(f"another trainer took over {self.run_dir} during step {done}: "
                                            "stopping without writing"))
            if stop:
                if self.saved_step != done:
                    self._save(done)
                return True
        if any_rank(self.failure is not None, self.s.env):  # after the last step's flags
            self._raise_failure(self._steps_done())
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
        failed = self.failure is not None or (self.writer is not None and self.writer.failed())
        return [self.stop.requested, lease is not None and lease.lost, failed]

    def _survive(self, err: Exception, what: str) -> None:
        """A failure this rank lives through: alone it ends the run at once;
        with peers it is kept for the next step's flag all-reduce (the first
        one counts), so every rank stops together instead of waiting on this
        one in a collective."""
        if not self.s.env.is_distributed:
            raise err
        log.error("rank %d: %s failed (%s: %s); every rank stops after the next step", self.s.env.rank, what,
                  type(err).__name__, err, exc_info=err)
        self.failure = self.failure or err

    def _raise_failure(self, done: int) -> None:
        """Every rank: raise the failure some rank reported, with its message."""
        env = self.s.env
        if self.failure is None and self.writer is not None and self.writer.failed():
            try:
                self.writer.wait()
            except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
                self.failure = err
        mine = f"{type(self.failure).__name__}: {self.failure}" if self.failure is not None else None
        messages = [mine]
        if env.is_distributed:
            messages = [None] * env.world_size
            torch.distributed.all_gather_object(messages, mine, group=control_group())
        rank, message = next((r, m) for r, m in enumerate(messages) if m is not None)
        if rank == env.rank:
            raise self._agree(self.failure)  # as it was raised: a LeaseLost stays one
        raise self._agree(TrainingError(f"rank {rank} failed: {message}; every rank stopped after step {done}"))

    def _agree(self, err: BaseException) -> BaseException:
        """`err`, raised on every rank after a flag all-reduce (not posted to the board)."""
        self.agreed = err
        return err

    def _stand_in_batches(self) -> list:
        """Batches of the right shape for a step whose own could not be fetched:
        this rank still takes part in the step's collectives, whose flags then
        stop every rank before the step's weights are checkpointed."""
        loader = self.s.loader
        zeros = torch.zeros((loader.micro_batch, loader.T), dtype=torch.long)
        return [(zeros, zeros)] * loader.accumulation_steps

    def _steps_done(self) -> int:
        return self.history["train"][-1][0] if self.history["train"] else self.s.start_step

    def _step(self, step: int) -> tuple[int, list[bool]]:
        """Steps done, and the flags of `_flags` as all ranks agreed on them."""
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
            self._survive(err, f"fetching the batches of step {step + 1}")
            batches = self._stand_in_batches()
        data_wait = s.loader.source.wait_seconds - waited
        try:
            loss, norm, agreed = train_step_with_flags(s.model, s.raw_model, s.optimizer, batches, s.ctx, self._flags)
        except torch.OutOfMemoryError as err:
            raise TrainingError(self._oom_message(step + 1, err)) from err
        synchronize(s.env.device)
        dt = now() - t0
        done = step + 1
        stop, lost, failed = agreed  # one process: its own flags, read before the step
        if failed:
            self._raise_failure(done)
        if not math.isfinite(loss):
            raise self._agree(TrainingError(
                f"loss is {loss} at step {done} of {cfg.max_steps}: training diverged; the last good checkpoint "
                f"is {self._last_checkpoint() or '(none yet)'}; lower train.lr or raise train.warmup_steps"
            ))
        self.throughput.add(cfg.total_batch_tokens, dt)
        self.train_loss = loss
        self.history["train"].append([done, loss])
        # A stop agreed at this step goes straight to the checkpoint (in the kill window).
        stopping = stop or lost
        val = None if stopping else self._validate(done)
        try:
            self._report(done, loss, lr, norm, cfg.total_batch_tokens / dt, val, data_wait)
        except Exception as err:  # noqa: BLE001 - rank 0's reporting (the progress hook, a status file)
            self._survive(err, f"reporting step {done}")
        if not stopping:
            self._hellaswag(done)
        if not stopping and _every(done, cfg.sample_every, cfg.max_steps):
            self._samples(done)
        if not lost and _every(done, cfg.checkpoint_every, cfg.max_steps):
            self._save(done)
        return done, agreed

    def _oom_message(self, step: int, err: Exception) -> str:
        limit = self.cfg.runtime.memory_limit_mb
        where = f"runtime.memory_limit_mb={limit}" if limit else str(self.s.env.device)
        return (f"out of memory at step {step} with micro-batch {self.s.micro_batch} x {self.cfg.model.block_size} "
                f"tokens ({where}): set a smaller train.micro_batch_size (or train.micro_batch_size=auto); "
                f"the global batch stays train.total_batch_tokens. ({str(err).splitlines()[0][:200]})")

    def _validate(self, done: int) -> float | None:
        if not _every(done, self.cfg.train.eval_every, self.cfg.train.max_steps):
            return None
        model = self.s.model.module if hasattr(self.s.model, "module") else self.s.model
        self.val_loss = evaluate(model, self.s.val, self.s.ctx)
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

    def _hellaswag(self, done: int) -> None:
        """The native HellaSwag scorer every eval.every_steps, items split over
        ranks. It never stops training: unloadable items only cost a warning."""
        every = self.cfg.eval.every_steps
        # The final step too: the finished model's score is the one people compare.
        if not every or not _every(done, every, self.cfg.train.max_steps) or self.hellaswag_items == []:
            return
        env = self.s.env
        if self.hellaswag_items is None:
            try:
                items = load_items(self.cfg.eval.hellaswag_source, self.cfg.eval.limit)
            except Exception as err:  # noqa: BLE001 - optional in-loop metric
                log.warning("in-loop HellaSwag disabled: cannot load %s (%s)", self.cfg.eval.hellaswag_source, err)
                items = []
            if any_rank(not items, env):  # all ranks score, or none
                self.hellaswag_items = []
                return
            # This rank's share, tokenized once for every evaluation of the run.
            self.hellaswag_items = prepare(items).subset(range(env.rank, len(items), env.world_size))
        mine = self.hellaswag_items
        try:
            with autocast(env.device, self.s.ctx.amp):
                m = evaluate_hellaswag(self.s.raw_model, mine, env.device, self._hellaswag_batch()) if len(mine) else {}
        except Exception as err:  # noqa: BLE001 - an OOM on this rank: it still joins the sum below
            self._survive(err, f"scoring HellaSwag at step {done}")
            m = {}
        n = m.get("n", 0)
        keys = ("acc", "acc_norm", "acc_norm_per_token")
        counts = all_reduce(torch.tensor([m.get(k, 0.0) * n for k in keys] + [n], dtype=torch.float64,
                                         device=env.device), env, op="sum")
        metrics = {f"hellaswag/{k}": (counts[i] / counts[-1]).item() for i, k in enumerate(keys)}
        if env.is_main:
            log.info("HellaSwag at step %d: %s", done, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            self.tracker.log_metrics(metrics, step=done)

    def _hellaswag_batch(self) -> int:
        """Items per forward pass: at least eval.batch_size, and as many as the
        training micro-batch's tokens allow: an item packs ~150-250 tokens for
        its four endings, and scoring keeps no activations for a backward pass,
        so half the micro-batch's tokens leave room for float32 log-probabilities."""
        return max(self.cfg.eval.batch_size, self.s.micro_batch * self.cfg.model.block_size // 512)

    def _samples(self, done: int) -> None:
        if not self.s.env.is_main:
            return
        try:
            self._write_samples(done)
        except Exception as err:  # noqa: BLE001 - rank 0 alone: the others go on to the next collective
            self._survive(err, f"writing the samples of step {done}")

    def _write_samples(self, done: int) -> None:
        texts = text_samples(self.s.raw_model, self.s.env.device, seed=self.cfg.train.seed + done)
        body = "\n\n".join(f"--- sample {i} ---\n{t}" for i, t in enumerate(texts))
        log.info("samples at step %d:\n%s", done, body)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"step_{done:06d}.txt"
            path.write_text(body + "\n")
            self.tracker.log_artifact(path, "samples")

    def _save(self, done: int) -> None:
        self.saved_step = done
        # The previous write's error, and any failure since the step's flags,
        # stop every rank here: no checkpoint of a step some rank failed in.
        if self.writer is not None:
            try:
                self.writer.wait()
            except Exception as err:  # noqa: BLE001 - raised on every rank just below
                self._survive(err, "writing the previous checkpoint")
        if any_rank(self.failure is not None, self.s.env):
            self._raise_failure(done)
        url = layout.checkpoint_dir(self.run_dir, done)
        held = self.writer.submit(url, self.s.raw_model, self.s.optimizer,
                                  self._state(done) if self.s.env.is_main else {"step": done},
                                  rng_state(self.s.env.device))
        log.debug("checkpoint %s snapshot took %.3fs; writing in the background", url, held)
        # Send the metrics up to this step now: a run killed later resumes from
        # here, and its MLflow curve then has no hole before the checkpoint.
        # Bounded, and skipped while MLflow is down (the outbox keeps them).
        self.tracker.flush(timeout=10, give_up_on_outage=True)

    def _state(self, done: int) -> dict:
        return {
            "step": done,
            "config": self.cfg.model_dump(mode="json"),
            "train_fingerprint": train_fingerprint(self.cfg),
            "run_name": self.run_name,
            "loader": self.s.loader.state_dict(),
            "mlflow_run_id": self.tracker.run_id,
            "train_loss": self.train_loss,
            "val_loss": self.val_loss,
            "val_loss_step": self.history["val"][-1][0] if self.history["val"] else None,
            "tokens_seen": done * self.cfg.train.total_batch_tokens,
            "tokens_per_second": self.throughput.tokens_per_second or self.saved_tps,
            "micro_batch_size": self.s.micro_batch,
            "world_size": self.s.env.world_size,
            "saved_at": datetime.now(timezone.utc).isoformat(),
            # Copied: the writer thread serializes this while the loop appends.
            "history": {k: [list(p) for p in v] for k, v in self.history.items()},
        }

    def _finish(self) -> None:
        if not self.s.env.is_main or not self.history["train"]:
            return
        with tempfile.TemporaryDirectory() as tmp:
            png = loss_curve_png(Path(tmp) / "loss_curve.png", self.history["train"], self.history["val"],
                                 self.run_name)
            self.tracker.log_artifact(png)
