"""SIGTERM, the notice a spot reclaim, a node drain or a pod eviction gives.

While training runs, SIGTERM only sets a flag: the loop finishes its step,
writes a checkpoint and stops. Then the signal is handed on to whoever
handled it before us: under Prefect that is the engine's own bridge, which
turns it into a Crashed run (or, under `prefect flow-run execute` with
PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=reschedule, an AwaitingRetry one),
the states the reschedule path acts on. A run that ended Failed instead
would never be rescheduled. With no handler above us (`python -m gpt2.train`)
the caller raises `Preempted` and the process exits 143.

How long the trainer then has before SIGKILL is gpt2.process.kill_window's.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Callable, Iterator

log = logging.getLogger(__name__)


class SigtermGuard:
    """Holds SIGTERM back while a checkpoint is due, then hands it on. With
    `interrupts`, the first Ctrl-C (SIGINT) is held back the same way (a
    terminal sends it to every process of the command: the trainer too), and
    a second one stops at once."""

    def __init__(self, on_signal: Callable[[], None] | None = None, interrupts: bool = False) -> None:
        self.requested = False
        self.signal: int | None = None
        """The signal that asked for the stop: SIGTERM or SIGINT."""
        self._on_signal = on_signal
        self._interrupts = interrupts
        self._previous = None
        self._previous_int = None

    def __call__(self, signum, frame) -> None:
        # A terminal's Ctrl-C reaches the trainer and its launcher, which hands it on as SIGTERM: the
        # same stop, said once, in either order (a trainer busy in a long C call runs both handlers
        # together, and the launcher's SIGTERM can be first). The Ctrl-C is what the user did, so it
        # names the stop whenever it comes.
        # Marked before anything is said: the other signal's handler can run inside this one, while
        # it logs (Python runs a pending handler between any two bytecodes; seen end to end).
        first, self.requested = not self.requested, True
        self.signal = signal.SIGINT if signum == signal.SIGINT else self.signal or signum
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, self._previous_int)  # the second one is not held back
            if first:
                log.warning("Ctrl-C: finishing this step, then writing a checkpoint (Ctrl-C again stops at "
                            "once, losing the steps since the last checkpoint)")
        elif first:
            log.warning("SIGTERM received: finishing this step, then writing a checkpoint")
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
        # A process started with Ctrl-C ignored (a shell's background job) keeps ignoring it.
        interrupts = self._interrupts and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        if interrupts:
            self._previous_int = signal.signal(signal.SIGINT, self)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, self._previous)
            if interrupts:
                signal.signal(signal.SIGINT, self._previous_int)

    @property
    def why(self) -> str:
        return "Ctrl-C" if self.signal == signal.SIGINT else "SIGTERM"

    def hand_on(self) -> None:
        """Once the checkpoint is safe: give SIGTERM to the handler we replaced,
        if it is one of Python's (an orchestrator's). It may raise (Prefect's
        raises TerminationSignal); if it returns, so do we. A Ctrl-C is not
        handed on: the caller says it stopped (Preempted)."""
        previous = self._previous
        if callable(previous) and self.signal != signal.SIGINT:
            signal.signal(signal.SIGTERM, previous)
            previous(signal.SIGTERM, None)
