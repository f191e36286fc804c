"""One trainer per run: a lease in the run directory that fences its writes.

Two trainers on one run delete each other's checkpoints and log into the same
MLflow run. It happens for real: a zombie false positive reschedules a run
whose old pod still trains, a rerun starts while a deployment trains, a
paused VM comes back. So a trainer first takes the run's lease:

    <run>/lease/000001.json     {"holder": {host, pid, flow_run_id, started}, "renewed_at": …}
    <run>/lease/000002.json     the next holder, once 000001 went stale

Taking it creates the next generation's file with an exclusive create
(`O_EXCL` locally, `ifGenerationMatch=0` on GCS, `If-None-Match` on S3:
fsspec's `mode="create"`), so of two trainers racing for it exactly one wins.
The generation is the fencing token: the holder renews its file every
`ttl/4`, and before every checkpoint commit it checks that no later
generation exists. A trainer that was paused past the lease's time and came
back finds a later generation and stops without writing anything. A lease
not renewed for `ttl` seconds is stale and may be taken over; a live one
makes a second trainer refuse at once, naming the holder (or wait for it).

Staleness compares the holder's wall clock (`renewed_at`) with the reader's,
so machines sharing a root need clocks within a small part of the ttl (NTP,
as every cloud VM has). Skew only costs time, never the run: a holder whose
clock runs behind may see its lease taken over early, and the fencing check
then stops it before its next checkpoint; one whose clock runs ahead keeps a
dead lease live for longer. A record dated in the future is logged.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from gpt2.errors import UserError
from gpt2.root import storage

log = logging.getLogger(__name__)


class LeaseHeld(UserError):
    """Another trainer holds this run; the message names it."""


class LeaseLost(UserError):
    """A later trainer took this run over; this one must not write."""


def _holder(flow_run_id: str | None) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "flow_run_id": flow_run_id,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _dead_here(record: dict) -> bool:
    """The holder ran on this machine and its process is gone (a SIGKILL, an
    OOM kill): its lease is void at once, no need to wait for it to go stale."""
    h = record.get("holder", {})
    if h.get("host") != socket.gethostname() or not isinstance(h.get("pid"), int):
        return False
    try:
        os.kill(h["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def describe(record: dict, now: float) -> str:
    h = record.get("holder", {})
    age = now - float(record.get("renewed_at", 0))
    return (f"host {h.get('host')}, pid {h.get('pid')}, flow run {h.get('flow_run_id') or '(none)'}, "
            f"started {h.get('started')}, last renewed {age:.0f} s ago")


def earlier_attempt_wait_s(record: dict, ttl_s: float, wait_s: float) -> float:
    """How long a trainer waits for its own flow run's earlier attempt to let
    go of the lease: a rescheduled run's old machine may still be stopping (a
    SIGTERM's checkpoint) or be gone without releasing it; two of its ttls
    cover both."""
    return max(wait_s, 2 * float(record.get("ttl_s", ttl_s)))


@dataclass
class Lease:
    directory: str
    """<run>/lease"""
    ttl_s: float
    flow_run_id: str | None = None
    generation: int = 0
    lost: bool = False
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    # --- taking it ---------------------------------------------------------

    def generations(self) -> list[int]:
        """Every generation taken so far, oldest first (one per trainer that held the run)."""
        return sorted(int(n[:-5]) for n in storage.list_dir(self.directory) if n.endswith(".json") and n[:-5].isdigit())

    def _url(self, generation: int) -> str:
        return storage.join(self.directory, f"{generation:06d}.json")

    def _record(self, renewed_at: float) -> bytes:
        return json.dumps({"holder": _holder(self.flow_run_id), "generation": self.generation,
                           "renewed_at": renewed_at, "ttl_s": self.ttl_s}).encode()

    def current(self) -> tuple[int, dict | None]:
        """The newest generation and its record (None: no lease, or a torn one)."""
        gens = self.generations()
        if not gens:
            return 0, None
        return gens[-1], storage.read_record(self._url(gens[-1]))

    def _live(self, record: dict | None, now: float) -> bool:
        if record is None or _dead_here(record):
            return False
        age = now - float(record.get("renewed_at", 0))
        if age < -self.ttl_s / 4:
            log.warning("lease %s was renewed %.0f s in this machine's future: the two clocks disagree "
                        "(sync them with NTP); %s", self.directory, -age, describe(record, now))
        return age < float(record.get("ttl_s", self.ttl_s))

    def holder(self) -> tuple[str, float] | None:
        """(the live holder's description, seconds until its lease goes stale
        unless renewed), or None when the lease is free or stale; reads only
        (`gpt2 preflight` asks without taking it)."""
        _, record = self.current()
        now = time.time()
        if not self._live(record, now):
            return None
        stale_in = float(record.get("ttl_s", self.ttl_s)) - (now - float(record.get("renewed_at", 0)))
        return describe(record, now), stale_in

    def held_by_this_run(self, record: dict | None) -> bool:
        """The holder is this flow run's own earlier attempt (the same flow run id)."""
        return bool(record and self.flow_run_id and record.get("holder", {}).get("flow_run_id") == self.flow_run_id)

    def try_acquire(self) -> str | None:
        """Take the lease if it is free or stale; else the holder's description."""
        now = time.time()
        gen, record = self.current()
        if self._live(record, now):
            return describe(record, now)
        if gen and record is not None and float(record.get("renewed_at", 0)) > 0:  # 0: released, not stale
            log.warning("taking over the stale lease of %s (%s)", self.directory, describe(record, now))
        self.generation = gen + 1
        try:
            storage.create_exclusive(self._url(self.generation), self._record(now))
        except FileExistsError:
            _, winner = self.current()
            return describe(winner, time.time()) if winner else "another trainer (it took the lease just now)"
        return None

    def acquire(self, wait_s: float = 0.0, poll_s: float = 5.0) -> "Lease":
        """Take the lease, waiting up to `wait_s` for a live holder to let go or
        go stale; raise LeaseHeld naming the holder otherwise. A holder of the
        same flow run is this run's own earlier attempt (a rescheduled run on a
        new machine after a preemption without notice): it is waited for until
        its lease goes stale."""
        _, record = self.current()
        if self.held_by_this_run(record) and self._live(record, time.time()):
            wait_s = earlier_attempt_wait_s(record, self.ttl_s, wait_s)
            log.info("this flow run's earlier attempt still holds %s; waiting up to %.0f s for it to go stale",
                     self.directory, wait_s)
        deadline = time.monotonic() + wait_s
        while True:
            holder = self.try_acquire()
            if holder is None:
                log.info("lease %s generation %d taken", self.directory, self.generation)
                self._start_renewing()
                return self
            if time.monotonic() >= deadline:
                raise LeaseHeld(
                    f"another trainer holds this run ({holder}); it stays held while that trainer renews it "
                    f"and goes stale {self.ttl_s:.0f} s after it stops. Stop that trainer, or wait for it "
                    f"(runtime.lease_wait_s); the lease is {self.directory}")
            log.info("run held by %s; waiting", holder)
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())) or poll_s)

    # --- keeping it --------------------------------------------------------

    def check(self) -> None:
        """Fencing: raise LeaseLost unless this is still the newest generation."""
        if self.lost:
            raise LeaseLost(self._lost_message())
        gens = self.generations()
        if gens and gens[-1] != self.generation:
            self.lost = True
            raise LeaseLost(self._lost_message())

    def still_held(self) -> bool:
        """check() as an answer: False once a later trainer took the run over
        (its MLflow sends are fenced too: gpt2.tracking.outbox); a storage error raises."""
        try:
            self.check()
        except LeaseLost:
            return False
        return True

    def _lost_message(self) -> str:
        return (f"the lease of {self.directory} passed to a later trainer (this one held generation "
                f"{self.generation}): stopping without writing; the other trainer continues the run")

    def renew(self) -> None:
        self.check()
        storage.write_bytes_atomic(self._url(self.generation), self._record(time.time()))

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.renew()
            except LeaseLost as err:
                log.error("%s", err)
                return
            except Exception as err:  # noqa: BLE001 - any storage failure: keep trying while the lease lasts
                log.warning("could not renew the lease %s: %s", self.directory, err)

    def release(self) -> None:
        """Stop renewing and let go (the file stays, marked free, as the history of holders)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self.lost:
            try:
                self.check()
                storage.write_bytes_atomic(self._url(self.generation), self._record(0.0))
            except Exception as err:  # noqa: BLE001 - a lease left behind goes stale by itself
                log.warning("could not release the lease %s: %s", self.directory, err)
