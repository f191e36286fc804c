"""Tying a child process to its parent, for the children the project starts
(torchrun, the preflight, Prefect's temporary server): torch-free, so the CLI
can use it before it imports anything heavy."""

from __future__ import annotations

import signal
import sys


def terminate_with_parent() -> None:
    """In a child, before exec: SIGTERM it when its parent dies (Linux), so it
    never outlives the process that started it, even one that was SIGKILLed:
    a trainer then checkpoints and exits instead of training on unowned, a
    server stops instead of holding its port and database."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
