"""SIGTERM, the notice a spot reclaim, a node drain or a pod eviction gives.

While training runs, SIGTERM only sets a flag: the loop finishes its step,
writes a checkpoint and stops. Then the signal is handed on to whoever
handled it before us: under Prefect that is the engine's own bridge, which
turns it into a Crashed run (or, under `prefect flow-run execute` with
PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=reschedule, an AwaitingRetry one),
the states the reschedule path acts on. A run that ended Failed instead
would never be rescheduled. With no handler above us (`python -m gpt2.train`)
the caller raises `Preempted` and the process exits 143.

How long the trainer then has before SIGKILL is gpt2.kill_window's.
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
