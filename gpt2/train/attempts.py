"""What each training attempt did, recorded in the run directory so the
record outlives the machine (gpt2.train.bill turns the records into the bill):

    <run>/attempts/000001.json
    {"attempt": 1, "host": "gpu-node-7", "pid": 4242, "device_type": "cuda",
     "device_name": "NVIDIA H100 80GB HBM3", "devices": 8, "lease_generation": 3,
     "started_at": 1790000000.0, "resumed_from": 1500, "step": 1730,
     "first_step_at": 1790000095.2, "startup_s": 93.1, "step_s": 61.0, "steps_timed": 229,
     "mfu": 0.41, "data_wait_s": 0.4, "heartbeat_at": 1790000160.4, "ended_at": 1790000161.0,
     "end": "preempted", "last_checkpoint": 1730, "message": null, "closed_by": null,
     "pool": "gpu-spot", "price_per_hour": 1.2,
     "spikes": [{"step": 1610, "loss": 3.9, "loss_z": 8.1, "grad_norm": 1.2, "grad_norm_z": 9.4,
                 "spike": true, "action": "skipped"}], "rolled_back_steps": 0,
     "startup_parts": {"imports": 6.1, "lease": 0.4, "data": 2.2, "checkpoint": 18.0, "probe": 20.5,
                       "compile": 3.1, "first_step": 1.1, "other": 4.6}}

Global rank 0 writes its attempt's record when it holds the run's lease, brings
it up to date after a step at most every `runtime.heartbeat_s`, and writes its
end: `done`, `preempted` (SIGTERM, checkpoint written) or `error`. A trainer
killed without notice (SIGKILL, a lost VM) never writes its end: the next
attempt closes its record as `killed`, ended at its last sign of life (its own
heartbeat or its lease's last renewal, whichever is later), so the time between
the kill and the next attempt is never billed. A rerun of a finished run trains
nothing and leaves no record. Times are Unix seconds of the writer's clock.

Each loss spike the attempt met (gpt2.train.spikes) is a line of `spikes`, written
at once; a rollback also adds the steps it threw away to `rolled_back_steps` and
sets `step` back to the checkpoint it went back to (the bill counts them redone).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import torch

from gpt2.checkpoint import catalog
from gpt2.checkpoint.lease import Lease
from gpt2.config.tree import Config
from gpt2.ladder.rungs import price_for
from gpt2.process.distributed import DistEnv
from gpt2.root import layout, storage
from gpt2.tracking.tracker import Tracker
from gpt2.train.bill import metrics, training_bill
from gpt2.train.progress import Progress, StepInfo

log = logging.getLogger(__name__)

ENDS = ("done", "preempted", "error", "killed")


def read_attempts(run_dir_url: str) -> list[dict]:
    """Every attempt record of a run, oldest first (torn records skipped)."""
    names = sorted(n for n in storage.list_dir(layout.attempts_dir(run_dir_url))
                   if n.endswith(".json") and n[:-5].isdigit())
    records = [storage.read_record(storage.join(layout.attempts_dir(run_dir_url), n)) for n in names]
    return [r for r in records if isinstance(r, dict)]


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def _last_sign_of_life(run_dir_url: str, record: dict) -> float:
    """When a trainer that never wrote its end was last seen alive: its record's
    heartbeat or its lease's last renewal (the lease thread renews during
    start-up too, when no step reports)."""
    seen = float(record.get("heartbeat_at") or record["started_at"])
    gen = record.get("lease_generation")
    lease = storage.read_record(storage.join(layout.lease_dir(run_dir_url), f"{gen:06d}.json")) if gen else None
    if isinstance(lease, dict) and lease.get("holder", {}).get("pid") == record.get("pid"):
        seen = max(seen, float(lease.get("renewed_at") or 0.0))
    return seen


def _checkpoint_step(run_dir_url: str) -> int | None:
    """The step of the run's newest complete checkpoint; None when there is none
    or the root cannot be read now (an attempt's end must not hide its error)."""
    try:
        latest = catalog.latest_checkpoint(run_dir_url)
    except Exception as err:  # noqa: BLE001 - the bill must never stop a training run
        log.warning("could not list the checkpoints of %s for the attempt record: %s", run_dir_url, err)
        return None
    return int(latest.rstrip("/").rsplit("step_", 1)[1]) if latest else None


class Attempt:
    """This process's attempt; every method is a no-op off global rank 0."""

    def __init__(self, config: Config, record: dict | None):
        self.run_dir, self.heartbeat_s = layout.run_dir(config), config.runtime.heartbeat_s
        self.batch_tokens, self.checkpoint_every = config.train.total_batch_tokens, config.train.checkpoint_every
        self.local_dir = layout.attempt_progress_dir(config)
        self.record, self.url, self._written = record, None, 0.0

    @classmethod
    def begin(cls, config: Config, env: DistEnv, lease: Lease | None, started_at: float,
              pool: str | None = None) -> Attempt:
        """Close the attempts that never wrote their end, then record this one
        (under the lease, so no other trainer numbers an attempt at once), with
        the work pool it runs on and that pool's price (gpt2.ladder.rungs.price_for)."""
        run_dir = layout.run_dir(config)
        attempt = cls(config, None)
        if not env.is_main:
            return attempt
        try:
            earlier = read_attempts(run_dir)
            number = max((int(r.get("attempt", 0)) for r in earlier), default=0) + 1
            for old in earlier:
                if old.get("end") is None:
                    _close_killed(run_dir, old, number, attempt.local_dir)
            record = {"attempt": number, "host": socket.gethostname(), "pid": os.getpid(),
                      "device_type": env.device.type, "device_name": _device_name(env.device),
                      "devices": env.world_size, "lease_generation": lease.generation if lease else None,
                      "started_at": started_at, "resumed_from": None, "step": None, "first_step_at": None,
                      "startup_s": None, "step_s": 0.0, "steps_timed": 0, "mfu": None, "data_wait_s": 0.0,
                      "heartbeat_at": time.time(), "ended_at": None, "end": None, "last_checkpoint": None,
                      "message": None, "closed_by": None,
                      "pool": pool, "price_per_hour": price_for(config, pool)}
            url = layout.attempt_record(run_dir, number)
            storage.create_exclusive(url, json.dumps(record).encode())
        except Exception as err:  # noqa: BLE001 - the bill must never stop a training run
            log.warning("this training attempt goes unrecorded (no bill for it): %s", err)
            return attempt
        attempt.record, attempt.url = record, url
        return attempt

    def resumed(self, step: int, max_steps: int) -> None:
        """The session knows where it starts; a run already at its last step
        trains nothing, so its record is withdrawn (a rerun adds no attempt)."""
        if self.record is None:
            return
        if step >= max_steps:
            storage.remove(self.url)
            self.record = None
            return
        self.record.update(resumed_from=step, step=step)
        self._write()

    def progress(self, inner: Progress | None) -> Progress | None:
        """`inner` with this attempt's step accounting in front of it."""
        if self.record is None:
            return inner

        def report(info: StepInfo) -> None:
            self._step(info)
            if inner is not None:
                inner(info)

        return report

    def _step(self, info: StepInfo) -> None:
        now, r = time.time(), self.record
        took = self.batch_tokens / info.tokens_per_second if info.tokens_per_second else 0.0
        first = r["first_step_at"] is None
        if first:  # its time is warm-up (compilation): kept out of step_s
            r["first_step_at"], r["startup_s"] = now, max(0.0, now - took - r["started_at"])
        else:  # the first step's wait for its batches is start-up
            r["step_s"] += took
            r["data_wait_s"] = r.get("data_wait_s", 0.0) + info.data_wait_seconds
            r["steps_timed"] += 1
            if info.mfu is not None:  # a running mean over the steady steps
                r["mfu"] = (r["mfu"] or 0.0) + (info.mfu - (r["mfu"] or 0.0)) / r["steps_timed"]
        r["step"], r["heartbeat_at"] = info.step, now
        # What a parent flow watching this run logs (flows.child_progress), as of the last write.
        r["progress"] = {"max_steps": info.max_steps, "loss": info.loss, "tokens_per_second": info.tokens_per_second,
                         "eta_s": info.eta_seconds}
        self._progress_here()
        # The first step at once: from then on the attempt counts in the bill,
        # even if it is killed before its first heartbeat; and with each
        # checkpoint, which is where the next attempt resumes.
        if first or now - self._written >= self.heartbeat_s or info.step % self.checkpoint_every == 0:
            self._write()

    def spike(self, event: dict) -> None:
        """A loss spike and what was done about it, written now."""
        if self.record is None:
            return
        self.record.setdefault("spikes", []).append(event)
        self._write()

    def precision(self, name: str) -> None:
        """What train.precision resolved to on this attempt's device (gpt2.train.precision)."""
        if self.record is not None:
            self.record["precision"] = name

    def skipped_step(self, step: int) -> None:
        """fp16's loss scaler skipped `step` (an inf or nan gradient): counted in
        `skipped_steps`, written with the next heartbeat."""
        if self.record is None:
            return
        self.record["skipped_steps"] = int(self.record.get("skipped_steps") or 0) + 1
        self.record["last_skipped_step"] = step

    def rolled_back(self, steps: int, to_step: int) -> None:
        """A rollback threw away `steps` trained steps; training goes on from `to_step`."""
        if self.record is None:
            return
        self.record["rolled_back_steps"] = int(self.record.get("rolled_back_steps") or 0) + steps
        self.record["step"] = to_step
        self._progress_here()  # a later attempt here must not take the step before the rollback for the last
        self._write()

    def startup(self, parts: dict[str, float], write: bool = True) -> None:
        """The start-up's parts (gpt2.train.startup)."""
        if self.record is None:
            return
        self.record["startup_parts"] = parts
        if write:
            self._write()

    def end(self, how: str, message: str | None = None) -> None:
        """Write how this attempt ended (one of ENDS) and its last complete checkpoint."""
        if self.record is None:
            return
        now = time.time()
        self.record.update(end=how, ended_at=now, heartbeat_at=now, message=message,
                           last_checkpoint=_checkpoint_step(self.run_dir))
        self._write()

    def _progress_here(self) -> None:
        """Every step, on this machine's disk (a rename, no upload): a later
        attempt here bills a killed one exactly, heartbeat or not."""
        r = self.record
        try:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            path = self.local_dir / f"{r['attempt']:06d}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"pid": r["pid"], "host": r["host"], "step": r["step"],
                                       "heartbeat_at": r["heartbeat_at"]}))
            os.replace(tmp, path)
        except OSError as err:  # the bill must never stop a training run
            log.debug("attempt progress not kept locally: %s", err)

    def _write(self) -> None:
        try:
            storage.write_record(self.url, self.record)
            self._written = time.time()
        except Exception as err:  # noqa: BLE001 - the bill must never stop a training run
            log.warning("could not update the attempt record %s: %s", self.url, err)


def _progress_kept_here(record: dict, local_dir: Path) -> dict | None:
    """The killed attempt's per-step progress, when it ran on this machine."""
    kept = storage.read_record(str(local_dir / f"{int(record['attempt']):06d}.json"))
    if isinstance(kept, dict) and kept.get("host") == record.get("host") and kept.get("pid") == record.get("pid"):
        return kept
    return None


def _close_killed(run_dir: str, record: dict, by: int, local_dir: Path) -> None:
    kept = _progress_kept_here(record, local_dir)
    if kept and int(kept.get("step") or 0) > int(record.get("step") or 0):
        record.update(step=int(kept["step"]), heartbeat_at=max(float(kept["heartbeat_at"]),
                                                              float(record.get("heartbeat_at") or 0)))
    seen = _last_sign_of_life(run_dir, record)
    record.update(end="killed", ended_at=seen, closed_by=by, last_checkpoint=_checkpoint_step(run_dir),
                  message=f"never wrote its end: closed by attempt {by} at its last sign of life")
    log.warning("attempt %s of %s (host %s, pid %s) was killed without notice; last seen alive %.0f s after "
                "it started", record.get("attempt"), run_dir, record.get("host"), record.get("pid"),
                seen - float(record["started_at"]))
    storage.write_record(layout.attempt_record(run_dir, int(record["attempt"])), record)


def settle(config: Config, env: DistEnv, mlflow_run_id: str | None, step: int, status: str) -> dict | None:
    """The run's bill after this attempt (rank 0; None elsewhere), also logged
    on the training's MLflow run at `step`, which is reopened and closed again
    with `status` (the loop has closed it by now)."""
    if not env.is_main:
        return None
    try:
        bill = training_bill(read_attempts(layout.run_dir(config)), config.runtime.price_per_hour)
    except Exception as err:  # noqa: BLE001 - the bill must never stop a training run
        log.warning("could not read the attempt records of %s: %s", layout.run_dir(config), err)
        return None
    log.info("bill: %d attempt(s), %.4f device-hours (%.4f redone, %d steps), %.1f s start-up%s",
             bill["attempts"], bill["device_hours"], bill["device_hours_redone"], bill["steps_redone"],
             bill["startup_s"], f", cost {bill['cost']:.2f}" if bill["cost"] is not None else "")
    if mlflow_run_id:
        # Bounded: after a SIGTERM this runs inside the kill window (the checkpoint is safe by now).
        tracker = Tracker(config, layout.run_name(config), run_id=mlflow_run_id, connect_timeout_s=5,
                          close_timeout_s=5)
        tracker.log_metrics(metrics(bill), step=step)
        tracker.close(status)
    return bill
