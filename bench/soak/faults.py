"""The faults of the soak (bench/soak/run.py) and the supervisor that plays the
platform: what a real deployment loses at random moments, and what a real
platform brings back.

Targets are found by the soak's mark in their environment (every process of
the soak's stack inherits it), so a soak never signals anything of another
stack or of the user's:

    server, mlflow, worker      the stack's services (cli.stack records them)
    flow-run                    a flow-run process a worker started (python -m prefect.engine)
    train-run                   the flow-run process whose trainer trains (with it: the machine)
    trainer                     python -m gpt2.train
    tokenizer                   a process-pool or Dask worker under a flow run

Actions: `kill` (SIGKILL), `term` (SIGTERM; a service gets the platform's
usual SIGKILL 10 s later if it is still there), `pause` (SIGSTOP of the
process and everything under it, SIGCONT after a while: a VM that froze and
came back); and two faults of their own: `mlflow-away` (the MLflow server
killed and kept down for minutes) and `disk-full` (the filesystem of the
pipeline's root and work dir filled, then freed).

The supervisor (bench.soak.stack) restarts a dead server or worker after a
short delay, as systemd or Kubernetes would (cli.stack.services.restart);
flow runs and trainers are left to Prefect (the automations) and to the
trainer's resume: that is what the soak tests.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

from cli.stack import processes, services

MARK_ENV = "GPT2_CHAOS_SOAK"
"""Set in the soak's stack environment: every process of it carries the soak's id."""

SERVICE_KINDS = ("server", "mlflow", "worker")
PROCESS_KINDS = ("flow-run", "train-run", "trainer", "tokenizer")
ACTIONS = ("kill", "term", "pause")
KINDS = tuple(f"{action}:{target}" for target in (*SERVICE_KINDS, *PROCESS_KINDS) for action in ACTIONS) + (
    "mlflow-away", "disk-full")
"""Every fault the soak knows, as it is counted in the soak's `faults`."""

TERM_GRACE_S = 10.0
"""A service that ignores SIGTERM gets SIGKILL after this (a platform's stop timeout)."""


@dataclass(frozen=True)
class Timing:
    """How long the faults last; the long soak uses the defaults (the issue's
    30-120 s pauses, three minutes of MLflow away), a short one shrinks them."""
    pause_s: tuple[float, float] = (30.0, 120.0)
    mlflow_away_s: float = 180.0
    disk_full_s: float = 30.0
    restart_delay_s: float = 5.0


@dataclass
class Fault:
    kind: str
    at_s: float
    """Seconds into the soak."""
    pipeline: int
    scripted: bool = False
    """Named by --script, not drawn."""
    target: str = ""
    """What was hit: `<name> pid <pid>`."""
    hit_trainer: bool = False
    """A trainer process that ran before the fault was gone after it."""


def _marked(proc: psutil.Process, mark: str) -> bool:
    try:
        return proc.environ().get(MARK_ENV) == mark
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def soak_processes(mark: str) -> list[psutil.Process]:
    """Every live process that carries the soak's mark."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and _marked(proc, mark):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def trainers(mark: str) -> list[psutil.Process]:
    return [p for p in soak_processes(mark) if "gpt2.train" in _cmdline(p) and "--config" in _cmdline(p)]


class TrainersSeen:
    """Every trainer process of the soak seen while it is open, sampled by a
    thread of its own. The soak's own loop cannot do it: its reads of the
    Prefect server wait while the server is frozen, and a whole trainer can
    start and end meanwhile (the long soak once counted an attempt record
    against no trainer seen, with the server paused for 96 s)."""

    def __init__(self, mark: str, every_s: float = 0.5):
        self.mark, self.every_s, self.pids = mark, every_s, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="trainers-seen", daemon=True)

    def __enter__(self) -> "TrainersSeen":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.pids.update(p.pid for p in trainers(self.mark))  # a last look

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.pids.update(p.pid for p in trainers(self.mark))
            self._stop.wait(self.every_s)


def targets(state_dir: Path, mark: str) -> dict[str, list[tuple[str, psutil.Process]]]:
    """What each kind of target has now: (name, process) pairs."""
    found: dict[str, list[tuple[str, psutil.Process]]] = {kind: [] for kind in (*SERVICE_KINDS, *PROCESS_KINDS)}
    state = services.read_state(state_dir) or {"processes": []}
    for rec in state["processes"]:
        proc = processes.process(rec)
        kind = "worker" if rec["name"].startswith("worker") else rec["name"]
        if proc is not None and kind in found:  # the rescheduler is no target: the kinds are the parts any Prefect deployment has
            found[kind].append((rec["name"], proc))
    runs = []
    for proc in soak_processes(mark):
        line = _cmdline(proc)
        if "prefect.engine" in line:
            runs.append(proc)
            found["flow-run"].append(("flow run " + proc.environ().get("PREFECT__FLOW_RUN_ID", "?")[:8], proc))
        elif "gpt2.train" in line and "--config" in line:
            found["trainer"].append(("trainer", proc))
    for run in runs:
        try:
            children = run.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for proc in children:
            line = _cmdline(proc)
            if "multiprocessing" in line or "distributed" in line or "dask" in line:
                found["tokenizer"].append(("tokenizer", proc))
            elif "gpt2.train" in line and "--config" in line:
                found["train-run"].append(("training flow run", run))
    return found


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class DiskFiller:
    """Fills the filesystem that holds `path` (one the soak mounted for the
    pipeline, so nothing else runs short) and frees it again."""

    BALLAST = ".chaos-ballast"

    def __init__(self, path: Path):
        self.path = path / self.BALLAST

    def fill(self) -> int:
        free = os.statvfs(self.path.parent).f_bavail * os.statvfs(self.path.parent).f_frsize
        # Unbuffered and appended: nothing is left to flush at close, and a fill while one
        # still holds the disk adds to it. A disk too full for the ballast itself is full as
        # the fault wants it (the long soak stopped on that ENOSPC once).
        try:
            with open(self.path, "ab", buffering=0) as out:
                try:
                    os.posix_fallocate(out.fileno(), out.tell(), max(free - 4096, 1))
                except OSError:
                    pass  # a filesystem without fallocate: write until it is full
                try:
                    chunk = b"\0" * (1 << 20)
                    while True:
                        out.write(chunk)
                except OSError:
                    pass
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
        return free

    def free(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass
class Injector:
    """Picks the faults from a seeded generator: which kind (among those
    whose target exists at that moment) and how long it lasts; the moments
    come from the same generator (bench/soak/run.py)."""

    state_dir: Path
    mark: str
    supervisor: Any
    """The platform (bench.soak.stack.Supervisor): `hold(name, seconds)` keeps a part down."""
    timing: Timing
    rng: random.Random
    kinds: tuple[str, ...]
    log: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    pending: list[threading.Thread] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)
    """What ends each lasting fault now (SIGCONT, the disk freed): `release`."""

    def available(self, disk: DiskFiller | None,
                  kinds: tuple[str, ...]) -> dict[str, list[tuple[str, psutil.Process]]]:
        now = targets(self.state_dir, self.mark)
        out: dict[str, list[tuple[str, psutil.Process]]] = {}
        for kind in kinds:
            if kind == "disk-full":
                if disk is not None:
                    out[kind] = []
            elif kind == "mlflow-away":
                if now["mlflow"]:
                    out[kind] = now["mlflow"]
            elif now[kind.split(":", 1)[1]]:
                out[kind] = now[kind.split(":", 1)[1]]
        return out

    def inject(self, pipeline: int, disk: DiskFiller | None, kind: str | None = None,
               lasting: float | None = None) -> Fault | None:
        """One fault: `kind` (a script's, `lasting` seconds where it lasts: a
        pause, MLflow away, a full disk), or one drawn among the kinds whose
        target exists now, lasting as Timing draws it."""
        scripted = kind is not None
        choices = self.available(disk, (kind,) if kind else self.kinds)
        if kind is None and choices:
            kind = self.rng.choice(sorted(choices))
        if kind not in choices:
            self.log(f"no target for {kind or 'any fault'} now ({len(choices)} kind(s) have one)")
            return None
        fault = Fault(kind, round(time.monotonic() - self.started, 1), pipeline, scripted=scripted)
        before = {p.pid for p in trainers(self.mark)}
        if kind == "disk-full":
            fault.target = str(disk.path.parent)
            hold = lasting or self.timing.disk_full_s
            free = disk.fill()
            self.log(f"fault {kind}: filled {free / 2**20:.0f} MiB of {fault.target} for {hold:.0f} s")
            self._later(hold, disk.free)
            self.undo.append(disk.free)
        else:
            name, proc = self.rng.choice(choices[kind])
            fault.target = f"{name} pid {proc.pid}"
            action = "kill" if kind == "mlflow-away" else kind.split(":", 1)[0]
            if kind == "mlflow-away":
                self.supervisor.hold(name, lasting or self.timing.mlflow_away_s)
            if action == "kill":
                processes.signal_all([proc], signal.SIGKILL)
            elif action == "term":
                processes.signal_all([proc], signal.SIGTERM)
                if kind.split(":", 1)[1] in SERVICE_KINDS:
                    self._later(TERM_GRACE_S, lambda p=proc: processes.signal_all([p], signal.SIGKILL))
            else:
                tree = _tree(proc)
                pause = lasting or self.rng.uniform(*self.timing.pause_s)
                processes.signal_all(tree, signal.SIGSTOP)
                self.undo.append(lambda t=tree: processes.signal_all(t, signal.SIGCONT))
                self._later(pause, lambda t=tree: processes.signal_all(t, signal.SIGCONT))
                fault.target += f" for {pause:.0f} s"
            self.log(f"fault {kind}: {fault.target} (drawn among {len(choices)} kinds)")
        time.sleep(3)  # time for a killed trainer's process to go
        fault.hit_trainer = bool(before - {p.pid for p in trainers(self.mark)})
        return fault

    def _later(self, seconds: float, action: Callable[[], None]) -> None:
        def run() -> None:
            time.sleep(seconds)
            action()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.pending.append(thread)

    def release(self) -> None:
        """End every lasting fault at once (the soak is stopping: nothing it
        froze or filled may outlive it)."""
        for undo in self.undo:
            undo()
        self.undo.clear()

    def settle(self) -> None:
        """Wait for every pause, hold and disk fill to end."""
        for thread in self.pending:
            thread.join()
        self.pending.clear()
