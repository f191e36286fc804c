"""SIGTERM, the notice a spot reclaim, a node drain or a pod eviction gives.

While training runs, SIGTERM only sets a flag: the loop finishes its step,
writes a checkpoint and stops. Then the signal is handed on to whoever
handled it before us: under Prefect that is the engine's own bridge, which
turns it into a Crashed run (or, under `prefect flow-run execute` with
PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=reschedule, an AwaitingRetry one),
the states the reschedule path acts on. A run that ended Failed instead
would never be rescheduled. With no handler above us (`python -m gpt2.train`)
the caller raises `Preempted` and the process exits 143.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Callable, Iterator

log = logging.getLogger(__name__)


class SigtermGuard:
    """Holds SIGTERM back while a checkpoint is due, then hands it on."""

    def __init__(self, on_signal: Callable[[], None] | None = None) -> None:
        self.requested = False
        self._on_signal = on_signal
        self._previous = None

    def __call__(self, signum, frame) -> None:
        log.warning("SIGTERM received: finishing this step, then writing a checkpoint")
        self.requested = True
        if self._on_signal is not None:
            self._on_signal()

    @contextlib.contextmanager
    def installed(self) -> Iterator["SigtermGuard"]:
        # Signal handlers can only be installed from the main thread; elsewhere
        # (a worker thread of an orchestrator) the default handling stays.
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._previous = signal.signal(signal.SIGTERM, self)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, self._previous)

    def hand_on(self) -> None:
        """Once the checkpoint is safe: give the signal to the handler we
        replaced, if it is one of Python's (an orchestrator's). It may raise
        (Prefect's raises TerminationSignal); if it returns, so do we."""
        previous = self._previous
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)
            previous(signal.SIGTERM, None)


TORCHRUN_STOP_S = 30.0
"""What torchrun (torch.distributed.elastic) gives its workers between the
SIGTERM it forwards and its SIGKILL."""


def kill_window(distributed: bool) -> tuple[float, str]:
    """(seconds, what sets them) a stopped trainer has to save its checkpoint:
    under torchrun its 30 s; alone, our launcher's grace (gpt2.train.launch).
    The pool bounds both: a Kubernetes pod gets its termination grace period
    (the gpu pool's termination_grace_period_seconds, deployments/)."""
    from gpt2.train.launch import STOP_GRACE_S  # launch imports this module

    if distributed and TORCHRUN_STOP_S < STOP_GRACE_S:
        return TORCHRUN_STOP_S, "torchrun's wait between its SIGTERM and SIGKILL"
    return STOP_GRACE_S, "the launcher's wait between SIGTERM and SIGKILL (gpt2.train.launch.STOP_GRACE_S)"


def window_warning(step: int, seconds: float, local_s: float, window: tuple[float, str]) -> str | None:
    """A warning when a checkpoint save outlasts the kill window, naming what
    to change; None when it fits. Every save is timed, so a save that would
    not survive a preemption is reported long before one happens."""
    limit, what = window
    if seconds <= limit:
        return None
    head = (f"the checkpoint of step {step} took {seconds:.1f} s (local write {local_s:.1f} s), more than the "
            f"{limit:.0f} s a preempted trainer gets ({what})")
    if local_s > limit:
        return (head + ": after a SIGTERM not even its local copy would be complete; put runtime.work_dir on a "
                "faster local disk (a local SSD) or give the pod longer (termination_grace_period_seconds)")
    return (head + ": after a SIGTERM only its local copy would be sure to be complete (uploaded when the run "
            "restarts on this machine; a new machine resumes from the previous checkpoint); for the upload to "
            "fit too, give the pod longer (termination_grace_period_seconds of the gpu pool) or use a root "
            "closer to the GPUs")
