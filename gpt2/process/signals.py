"""Signals that stop a process: whether this one was asked to stop by Ctrl-C
(SIGINT), and a child tied to its parent, so that the parent's death reaches it
as a SIGTERM. Torch-free, so the CLI can use it before it imports anything heavy.

Prefect's engines swallow a KeyboardInterrupt that arrives just after a flow's
or task's own code has finished (its state is final by then), and the run
carries on. The command-line records the Ctrl-C here as it raises it, so the
pipeline's stage runner stops before its next stage even when Prefect did not.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading

_requested = threading.Event()
_stopped = threading.Event()  # the program has acted on the Ctrl-C: nothing is delivered again
_unraisable_hook = sys.unraisablehook


def requested() -> bool:
    return _requested.is_set()


def _on_ctrl_c(signum, frame) -> None:
    _requested.set()
    raise KeyboardInterrupt


def _on_unraisable(unraisable) -> None:
    """A Ctrl-C that lands while a finalizer runs (an object's __del__, a weakref callback: asyncio's
    transports, SQLAlchemy's registries) cannot stop anything there: Python prints it as "Exception
    ignored in ..." with a traceback and carries on. It is raised again in the main thread a moment
    later, once the finalizer has returned (raised from this hook it would be ignored the same way);
    nothing is printed."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and _requested.is_set() and \
            signal.getsignal(signal.SIGINT) is _on_ctrl_c:  # not a trainer's own "finish the step" handler
        later = threading.Timer(0.05, _deliver_again)
        later.daemon = True
        later.start()
        return
    _unraisable_hook(unraisable)


def _deliver_again() -> None:
    # Not once the program has stopped for it meanwhile (stop_if_requested, the command's own
    # handler): a KeyboardInterrupt on the way out would end the process by SIGINT, not its exit code.
    if not _stopped.is_set() and not sys.is_finalizing():
        _thread.interrupt_main()


def stopped() -> None:
    """The program has acted on the Ctrl-C (it is stopping): no swallowed one is delivered again."""
    _stopped.set()


def watch() -> None:
    """In the main thread of a command: a Ctrl-C is recorded, then raised as
    Python's default handler does. A process that ignores SIGINT (a shell's
    background job) keeps ignoring it."""
    global _unraisable_hook
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_ctrl_c)
        if sys.unraisablehook is not _on_unraisable:
            _unraisable_hook, sys.unraisablehook = sys.unraisablehook, _on_unraisable


def stop_if_requested() -> None:
    """Between units of work (a pipeline's stages): a Ctrl-C that was swallowed stops here."""
    if _requested.is_set():
        _stopped.set()
        raise KeyboardInterrupt


def terminate_with_parent() -> None:
    """For the children the project starts (torchrun, the preflight, Prefect's
    temporary server). In a child, before exec: SIGTERM it when its parent dies (Linux), so it
    never outlives the process that started it, even one that was SIGKILLed:
    a trainer then checkpoints and exits instead of training on unowned, a
    server stops instead of holding its port and database."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
