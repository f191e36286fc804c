"""Run the training stage on this machine: in-process on one device, or as
`torchrun --nproc_per_node=N -m gpt2.train` for several GPUs, and with
`runtime.nnodes` > 1 as this machine's part of a c10d rendezvous
(gpt2.launch.multinode).

A torchrun child reports in structured form, never through its log lines:
rank 0 (and, on the other machines of a multi-node run, each one's local
rank 0, outcome only) appends one JSON object per line to a status file (`--status PATH`):
`{"event": "step", ...StepInfo}` after every step, then exactly one of
`{"event": "done", "result": {...}}`, `{"event": "preempted", "message": ...}`
or `{"event": "error", "message": ...}`. The parent reads new events as they
come for its progress display, and the last one for the outcome. The
workers' log lines are only handed on to the caller (the Prefect flow streams
them into its own logger).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

from gpt2.config.tree import Config
from gpt2.eval.core.fetch import for_training as core_bundle_for_training
from gpt2.launch import k8s_run, multinode
from gpt2.process import kill_window
from gpt2.process.distributed import resolve_nproc, visible_gpus
from gpt2.process.kill_window import STOP_GRACE_S
from gpt2.process.signals import terminate_with_parent
from gpt2.root import layout
from gpt2.train.preemption import SigtermGuard
from gpt2.train.progress import Progress
from gpt2.train.run import Preempted, TrainResult, train
from gpt2.train.session import TrainingError, check_batch_shape
from gpt2.train.status_file import StatusFile, step_info
from gpt2.weights.init import with_resolved_init

log = logging.getLogger(__name__)

RELAUNCHES = 3
"""How many times one launch starts a trainer again that was stopped from
outside, by a signal the launcher neither sent nor received (the kernel's OOM
killer, a stray `kill`): the next one resumes from the newest checkpoint, as a
rescheduled run would, on the machine already paid for. A machine that goes
away takes the launcher with it; the reschedule automation brings that run
back. Only on one machine: a multi-node group restarts together or not at all."""
RELAUNCH_PAUSE_S = 3.0
"""Before a relaunch: a platform stopping the whole machine signals the
launcher too, and its stop (the orchestrator's SIGTERM bridge) lands here first."""


class StoppedFromOutside(TrainingError):
    """The trainer ended by a signal that did not come through the launcher;
    `then`: what the launch raises where it starts no other (Preempted for a
    SIGTERM, as before relaunches existed: multi-node, or past RELAUNCHES)."""

    def __init__(self, message: str, then: TrainingError):
        super().__init__(message)
        self.then = then


def torchrun_command(config_path: Path, status_path: Path, nproc: int, parent_run_id: str | None,
                     tags: dict | None, rendezvous: list[str] | None = None) -> list[str]:
    """The trainer's command line: under torchrun for several processes or
    with `rendezvous` (multinode.rendezvous_args), plain `python -m gpt2.train` for one."""
    launcher = []
    if nproc > 1 or rendezvous:
        launcher = ["-m", "torch.distributed.run", *(rendezvous or ["--standalone"]), f"--nproc_per_node={nproc}"]
    cmd = [sys.executable, *launcher, "-m", "gpt2.train", "--config", str(config_path), "--status", str(status_path)]
    if parent_run_id:
        cmd += ["--parent-run-id", parent_run_id]
    for key, value in (tags or {}).items():
        cmd += ["--tag", f"{key}={value}"]
    return cmd


def _orchestrated() -> bool:
    """Someone above us handles SIGTERM (Prefect's engine bridge): leave it in
    place; `prefect flow-run execute` only acknowledges a graceful stop while
    it is installed, and otherwise kills the run at once."""
    return threading.current_thread() is not threading.main_thread() or callable(signal.getsignal(signal.SIGTERM))


def _stop(proc: subprocess.Popen, emit: Callable[[str], None]) -> None:
    """We are going away: tell the trainer, and give it the time to checkpoint."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    killer = threading.Timer(STOP_GRACE_S, proc.kill)
    killer.start()
    try:
        for line in proc.stdout:
            emit(line.rstrip())
        proc.wait()
    finally:
        killer.cancel()


def nproc_per_node(config: Config) -> int:
    """`runtime.nproc_per_node` resolved here, on the machine that trains: with
    `auto` the GPUs this machine was given (the pool's GPU count) decide."""
    return resolve_nproc(config.runtime.nproc_per_node, visible_gpus(config.runtime.device))


def torchrun_train(config: Config, progress: Progress | None = None, log_line: Callable[[str], None] | None = None,
                   parent_run_id: str | None = None, tags: dict | None = None,
                   nproc: int | None = None, rendezvous_host: bool | None = None) -> TrainResult:
    """`_launch` once, and again (up to RELAUNCHES times) where the trainer
    was stopped from outside on a single machine."""
    emit = log_line or log.info
    for relaunch in range(RELAUNCHES + 1):
        try:
            return _launch(config, progress, log_line, parent_run_id, tags, nproc, rendezvous_host)
        except StoppedFromOutside as err:
            if relaunch == RELAUNCHES or config.runtime.nnodes > 1:
                raise err.then from None
            emit(f"WARNING: {err}; starting it again from its newest checkpoint "
                 f"(relaunch {relaunch + 1} of {RELAUNCHES})")
            time.sleep(RELAUNCH_PAUSE_S)
    raise AssertionError("unreachable")


def _launch(config: Config, progress: Progress | None, log_line: Callable[[str], None] | None,
            parent_run_id: str | None, tags: dict | None, nproc: int | None,
            rendezvous_host: bool | None) -> TrainResult:
    """`train` in a child process: `nproc` (default: `runtime.nproc_per_node`)
    workers under torchrun, or one `python -m gpt2.train`. A SIGTERM to us reaches the
    trainer, which checkpoints and stops: directly when nobody above us
    handles the signal (then Preempted), or, under an orchestrator's own
    handler, when that handler raises in this thread (then its exception).
    `rendezvous_host`: whether this node serves a multi-node rendezvous
    (multinode.rendezvous_args)."""
    emit = log_line or log.info
    with tempfile.TemporaryDirectory(prefix="gpt2-train-") as tmp:
        config_path, status = Path(tmp) / "run.json", StatusFile(Path(tmp) / "status.jsonl")
        config_path.write_text(json.dumps(config.model_dump(mode="json")))
        rendezvous = multinode.rendezvous_args(config, rendezvous_host) if config.runtime.nnodes > 1 else None
        cmd = torchrun_command(config_path, status.path, nproc or nproc_per_node(config), parent_run_id, tags,
                               rendezvous)
        emit("starting: " + " ".join(cmd))
        # runtime.pool reaches the trainer's checkpoint writer (its kill window) through the environment.
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               kill_window.POOL_ENV: kill_window.resolve_pool(config.runtime.pool)}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                preexec_fn=terminate_with_parent)
        tail: deque[str] = deque(maxlen=40)
        last: dict = {}
        guard = None if _orchestrated() else SigtermGuard(on_signal=lambda: proc.send_signal(signal.SIGTERM))
        # (Under an orchestrator its SIGTERM bridge raises in this thread: the except below.)
        try:
            with guard.installed() if guard else contextlib.nullcontext():
                for line in proc.stdout:
                    tail.append(line.rstrip())
                    emit(line.rstrip())
                    last = _follow(status, progress) or last
                code = proc.wait()
        except BaseException:  # the orchestrator's SIGTERM bridge, Ctrl-C, a cancellation
            _stop(proc, emit)
            raise
        last = _follow(status, progress) or last
    return _outcome(last, code, tail, signalled=bool(guard and guard.requested))


def _follow(status: StatusFile, progress: Progress | None) -> dict | None:
    """Hand new step events to `progress`; return the newest event, if any."""
    events = status.read_new()
    for event in events:
        if event["event"] == "step" and progress is not None:
            progress(step_info(event))
    return events[-1] if events else None


def _outcome(last: dict, code: int, tail: deque[str], signalled: bool = False) -> TrainResult:
    """The trainer's result, or the exception that says how it ended;
    `signalled`: the launcher itself was told to stop (and told the trainer)."""
    kind = last.get("event")
    if code == 0 and kind == "done":
        return TrainResult(**last["result"])
    if kind == "preempted":
        preempted = Preempted(f"the trainer stopped by SIGTERM (exit {code}): {last['message']}")
        if signalled:
            raise preempted
        raise StoppedFromOutside(f"the trainer was stopped by a SIGTERM that did not come through its launcher "
                                 f"(exit {code}): {last['message']}", preempted)
    if code < 0 and kind not in ("done", "error"):
        raise _killed_from_outside("the trainer", -code)
    root = _root_cause_signal(tail) if code > 0 and not signalled else None
    if root is not None:
        # Several ranks under torchrun: one killed (an OOM kill takes the
        # largest process, one rank), torchrun stops the rest and exits 1; the
        # others may record an error of their own (a peer gone mid-collective).
        raise _killed_from_outside(f"rank {root[1]} of the trainer", root[0])
    if kind == "error":
        raise TrainingError(f"the trainer exited with code {code}: {last['message']}")
    # No outcome recorded: a worker died (killed, a crash outside the trainer).
    errors = [line for line in tail if "ERROR" in line or "Error" in line] or list(tail)[-10:]
    raise TrainingError(f"the trainer exited with code {code}:\n" + "\n".join(errors[-10:]))


_ROOT_CAUSE = re.compile(r"^\s*Root Cause \(first observed failure\):")
_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)")


def _root_cause_signal(tail: deque[str] | list[str]) -> tuple[int, int] | None:
    """(signal, rank) where torchrun's failure summary (torch.distributed.elastic's
    ChildFailedError, printed last as it exits) names as the root cause a rank
    that a signal ended (`exitcode  : -9 (pid: N)  (SIGKILL)`); None otherwise."""
    lines = list(tail)
    starts = [i for i, line in enumerate(lines) if _ROOT_CAUSE.match(line)]
    if not starts:
        return None
    fields: dict[str, int] = {}
    for line in lines[starts[-1] + 1:]:
        match = _FIELD.match(line)
        if match:
            fields.setdefault(match.group(1), int(match.group(2)))
    code = fields.get("exitcode")
    return (-code, fields.get("rank", 0)) if code is not None and code < 0 else None


def _killed_from_outside(who: str, signum: int) -> StoppedFromOutside:
    try:
        name = signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        name = f"signal {signum}"
    killed = TrainingError(f"{who} was killed by signal {signum} ({name}) that did not come through its launcher")
    return StoppedFromOutside(str(killed), killed)


def expected_save_warning(config: Config, nproc: int) -> str | None:
    """Before the run: whether the checkpoint a SIGTERM asks for is expected
    to fit the kill window of where it trains (runtime.pool), as `gpt2 plan` says."""
    from gpt2.cost.plan import CHECKPOINT_BYTES_PER_PARAM, model_size  # plan imports the trainer's modules

    distributed = nproc > 1 or config.runtime.nnodes > 1
    window = kill_window.kill_window(distributed, config.runtime.pool)
    return kill_window.expected_window_warning(model_size(config)[0] * CHECKPOINT_BYTES_PER_PARAM,
                                              layout.local_root(config) is None, window,
                                              config.train.checkpoint_every)


def train_stage(config: Config, progress: Progress | None = None, log_line: Callable[[str], None] | None = None,
                parent_run_id: str | None = None, tags: dict | None = None, isolate: bool = False) -> TrainResult:
    """Train on one device in this process, or in a child process: always for
    several devices (torchrun), and with `isolate` for one (what the Prefect
    task asks for, so the flow-run process stays responsive and keeps its own
    SIGTERM handling). With `runtime.nnodes` > 1 this is one machine's part:
    every machine runs the same config."""
    # train.init_from fetched once here, before any rank starts: the ranks read the root's copy
    # (gpt2.weights.init), never race each other to the source.
    config = with_resolved_init(config)
    core_bundle_for_training(config)  # eval.core_every's CORE bundle: the same, fetched here before any rank starts
    nproc = nproc_per_node(config)
    # Fail here, before any process starts, when the global batch cannot split over every node's processes.
    check_batch_shape(config, multinode.world_size(config, nproc))
    warning = expected_save_warning(config, nproc)
    if warning:
        log.warning(warning)
        if log_line:
            log_line("WARNING: " + warning)
    if config.runtime.nnodes > 1 and isolate:
        if k8s_run.in_cluster():  # a pod of the Kubernetes pool: the nodes are the pods of a Job of their own
            multinode.warn_unshared_root(config)
            k8s_run.check_node_gpus(config, visible_gpus(config.runtime.device))
            return k8s_run.kubernetes_train(config, nproc, log_line, parent_run_id, tags)
    multinode.check(config)
    if isolate or nproc > 1 or config.runtime.nnodes > 1:
        return torchrun_train(config, progress, log_line, parent_run_id, tags, nproc)
    return train(config, progress=progress, parent_run_id=parent_run_id, tags=tags)
