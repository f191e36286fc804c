"""When a GPU stage's run leaves its rung of the ladder of GPU pools for the
next (gpt2.ladder.rungs names the rungs' deployments). This module is the
decision alone, from a run's state history as Prefect
records it, so it is the same after a restart of the parent or the server:

    verdict(history, rung, last=False, now=…, stage_start_timeout_s=3600, crash_grace_s=120)
    -> Verdict("wait") | Verdict("done") | Verdict("failed", why) | Verdict("leave", why)

A run leaves a rung (never the last) when it has waited longer than the rung's
start_timeout_s to start (no worker, no machine: Scheduled, Late, Pending), when
its job crashed before the flow ran (a pod that could not be scheduled, a job
refused for its accelerators: Crashed, never Running), or when it was preempted
max_preemptions times there. On the last rung it waits as a stage always did
(runtime.stage_start_timeout_s), and a crash that nothing reschedules within the
grace fails the stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from gpt2.config.runtime import GpuPool

WAITING = ("SCHEDULED", "PENDING")


class State(NamedTuple):
    """One entry of a flow run's state history."""

    type: str  # Prefect's StateType value: SCHEDULED, PENDING, RUNNING, CRASHED, …
    name: str  # Scheduled, Late, AwaitingRetry, …
    timestamp: float  # Unix seconds
    message: str = ""


@dataclass(frozen=True)
class Verdict:
    action: Literal["wait", "done", "failed", "leave"]
    why: str = ""


def preemptions(history: list[State]) -> int:
    """How many times the run was taken off a machine while it ran: each
    stretch of Running that ended Crashed (a SIGTERM through the process
    worker, a zombie) or back to Scheduled (AwaitingRetry: `prefect flow-run
    execute`'s reschedule behaviour)."""
    count = 0
    for before, after in zip(history, history[1:]):
        if before.type == "RUNNING" and after.type in ("CRASHED", "SCHEDULED"):
            count += 1
    return count


def waiting_since(history: list[State]) -> float | None:
    """When the run's current stretch of waiting to start began (None if it is
    not waiting): the first of the trailing Scheduled/Pending states, so a Late
    or a rescheduled state does not restart the clock."""
    if not history or history[-1].type not in WAITING:
        return None
    start = len(history) - 1
    while start > 0 and history[start - 1].type in WAITING:
        start -= 1
    return history[start].timestamp


def verdict(history: list[State], rung: GpuPool, last: bool, now: float, stage_start_timeout_s: float,
            crash_grace_s: float) -> Verdict:
    """What to do with a stage's run on `rung`, given its state history (oldest first)."""
    if not history:
        return Verdict("wait")
    state = history[-1]
    ran = any(s.type == "RUNNING" for s in history)
    if state.type == "COMPLETED":
        return Verdict("done")
    if state.type in ("FAILED", "CANCELLED"):
        return Verdict("failed", f"ended {state.name}: {state.message}".rstrip(": "))
    taken = preemptions(history)
    if not last and taken >= rung.max_preemptions:
        return Verdict("leave", f"{rung.pool}: preempted {taken} times")
    if state.type == "CRASHED":
        if not ran and not last:
            return Verdict("leave", f"{rung.pool}: its job crashed before the flow ran ({state.message or 'no message'})")
        if now - state.timestamp < crash_grace_s:
            # The reschedule automation acts within its 20 s; on the last rung a run that crashed before
            # it ever ran is started again by the backstops within the same budget (flows.reschedule).
            return Verdict("wait")
        why = "its job crashed before the flow ran" if not ran else "crashed and was not rescheduled"
        return Verdict("failed" if last else "leave", f"{rung.pool}: {why} ({state.message or 'no message'})")
    since = waiting_since(history)
    timeout = stage_start_timeout_s if last else rung.start_timeout_s
    if since is not None and now - since > timeout:
        why = f"{rung.pool}: not started within {timeout:.0f} s ({state.name})"
        return Verdict("failed" if last else "leave", why)
    return Verdict("wait")
