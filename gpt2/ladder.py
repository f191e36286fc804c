"""The ladder of GPU pools (runtime.gpu_pools): which deployment a GPU stage
runs on at each rung, and when its run leaves a rung for the next.

Prefect cannot move a flow run to another pool (a run's pool is its
deployment's), so moving down a rung is cancelling the run on the rung it
leaves and starting the next rung's deployment (flows/ladder.py does both).
This module is the decision alone, from a run's state history as Prefect
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

from gpt2 import layout, storage
from gpt2.config import Config, GpuPool
from gpt2.errors import UserError

FLOWS = {"train": "gpt2-train", "evaluate": "gpt2-eval"}
"""The GPU stages and their flows' names (prefect.yaml's entrypoints)."""
DEFAULT_POOL = "gpu"
"""The pool of prefect.yaml's own `train` and `evaluate` deployments."""
WAITING = ("SCHEDULED", "PENDING")
IN_PROCESS = ("runtime.gpu_pools is a ladder of work pools, but this pipeline runs its stages in this process, on "
              "no pool: run it from its deployment (`prefect deployment run gpt2/full-pipeline`; locally on `gpt2 "
              "stack up --gpu-pools POOL,...`), or drop runtime.gpu_pools")
"""The refusal of a ladder given to `gpt2 run` (and to the parent flow run outside a deployment)."""


def deployment(stage: str, pool: str) -> str:
    """The stage's deployment on `pool` (prefect.yaml names one per rung):
    `gpt2-train/train` on the `gpu` pool, `gpt2-train/train-gpu-spot` on `gpu-spot`."""
    name = stage if pool == DEFAULT_POOL else f"{stage}-{pool}"
    return f"{FLOWS[stage]}/{name}"


def price_for(config: Config, pool: str | None) -> float | None:
    """One device-hour on `pool`: its rung's price, else runtime.price_per_hour."""
    for rung in config.runtime.gpu_pools:
        if rung.pool == pool and rung.price_per_hour is not None:
            return rung.price_per_hour
    return config.runtime.price_per_hour


class LeftRung(UserError):
    """This stage run's rung was left by the ladder: it must not train or evaluate."""


def stop_if_left(config: Config, lease, flow_run_id: str | None) -> None:
    """Right after the trainer took the run's lease (rank 0 holds `lease`): a run
    whose rung the ladder left while it was starting (the race: its worker took
    it just as the ladder moved on) lets the lease go and stops, having trained
    nothing. The ladder marks the run before it cancels it and before it starts
    the next rung's run, so the check cannot miss a run that was left."""
    if lease is None or not flow_run_id:
        return
    marker = layout.left_run_marker(layout.root(config), flow_run_id)
    if storage.exists(marker):
        lease.release()
        why = storage.read_bytes(marker).decode(errors="replace")
        raise LeftRung(f"flow run {flow_run_id} was moved off its work pool by the ladder of GPU pools ({why}); "
                       "it trains nothing: the run goes on on the next rung")


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
