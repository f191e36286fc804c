"""Backstops for the reschedule automation: a crashed preemptible flow run
put back to Scheduled exactly as `gpt2-reschedule-preempted` would have,
where that automation should have acted and did not.

The automation is edge-triggered: it acts on a flow run's Crashed event.
A Prefect server can lose or hold that event. After a restart its event
ordering holds a Crashed event that follows a Running event from before the
restart for 15 minutes (Prefect 3.9, prefect.server.events.ordering); on
SQLite under load an event whose processing hit a locked database can be
dropped, and the event that follows it then waits for a leader that never
comes. The fault soak found both (bench/soak/run.py): a stage left Crashed
failed its pipeline, and a pipeline's own parent, killed while the server
was busy, stayed Crashed for good.

The backstops are level-triggered instead: they look at runs' states, not
at events. The parent flow puts back a stage run of its own
(flows.stages._settled); the local stack's rescheduler
(cli.stack.rescheduler, a part of `gpt2 stack up`; `python -m
flows.reschedule` beside the workers of a server of your own) sweeps every
Crashed preemptible run, the pipeline's parent included. Both act only where the
automation is enabled on the server and matches the run (its `preemptible`
tag, a run count within its list), and only after a grace far longer than
the automation's own 20 s wait, so where the automation works they never
act.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from datetime import datetime, timezone
from typing import Any, Callable

from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.states import Scheduled

from flows.deployment_file import RESCHEDULE_AUTOMATION

PREEMPTIBLE = "preemptible"
GRACE_S = 120.0
"""How long a Crashed run is left to the automation (which waits 20 s)."""
UNSTARTED_GRACE_S = 30.0
"""How long a run that crashed before it ever ran is left Crashed: the automation never
acts on one, so only the worker's own late report of the crash is waited out."""
SWEEP_EVERY_S = 15.0


def automation_run_counts(client: Any) -> set[str]:
    """The run counts the enabled reschedule automation puts back (none: no
    automation, so no backstop either)."""
    return {count for a in client.read_automations_by_name(RESCHEDULE_AUTOMATION)
            if a.enabled and "prefect.run-count" in a.trigger.match
            for count in a.trigger.match["prefect.run-count"]}


def the_automation_would(run: FlowRun, counts: set[str]) -> bool:
    return run.state is not None and run.state.type == StateType.CRASHED and PREEMPTIBLE in (run.tags or []) \
        and str(run.run_count) in counts


def unstarted_crashes(client: Any, run: FlowRun, counts: set[str]) -> int | None:
    """For a preemptible run that crashed before it ever ran (run count 0): how
    many times it crashed so, while that is within the automation's budget
    (len(counts)); None otherwise. The automation leaves run count 0 alone, as a
    start that can never work (a bad image) would crash for ever; but a process
    started while the Prefect server was away (restarting, an upgrade) exits
    before its flow runs, and the stage it belonged to failed its pipeline
    (found by the fault soak). Counting the Crashed states in the run's history
    gives such a start the same budget and still ends a broken one."""
    if not (counts and run.run_count == 0 and run.state is not None and run.state.type == StateType.CRASHED
            and PREEMPTIBLE in (run.tags or [])):
        return None
    crashes = sum(1 for s in client.read_flow_run_states(run.id) if s.type == StateType.CRASHED)
    return crashes if crashes <= len(counts) else None


def why_put_back(client: Any, run: FlowRun, counts: set[str], grace_s: float) -> str | None:
    """Why a backstop puts the crashed run back (its state's message says it), or
    None where neither the automation's rule nor unstarted_crashes' holds."""
    if the_automation_would(run, counts):
        return f"still Crashed {grace_s:.0f} s after the crash, which {RESCHEDULE_AUTOMATION} did not act on"
    crashes = unstarted_crashes(client, run, counts)
    if crashes is None:
        return None
    return f"it crashed before it ever ran (crash {crashes}), which {RESCHEDULE_AUTOMATION} leaves alone"


def grace_for(run: FlowRun, grace_s: float) -> float:
    return min(grace_s, UNSTARTED_GRACE_S) if run.run_count == 0 else grace_s


def crashed_for_s(run: FlowRun, now: datetime) -> float:
    return (now - run.state.timestamp).total_seconds()


def propose(client: Any, run: FlowRun, state: Any) -> tuple[bool, str]:
    """Propose `state` for the run; (accepted, why not): it moved meanwhile, or the server refuses."""
    answer = client.set_flow_run_state(run.id, state)
    if answer.status != SetStateStatus.ACCEPT:
        return False, str(getattr(answer.details, "reason", None) or answer.status)
    return True, ""


def put_back(client: Any, run: FlowRun, by: str, why: str) -> tuple[bool, str]:
    """Set the run AwaitingRetry, as the automation does, saying `why` (why_put_back); (done, why not)."""
    return propose(client, run, Scheduled(name="AwaitingRetry", message=(
        f"Rescheduled by {by}: {why}; resumes from its newest checkpoint.")))


def sweep(client: Any, grace_s: float = GRACE_S, now: datetime | None = None,
          say: Callable[[str], None] = print) -> list[str]:
    """Put back every preemptible run Crashed longer than `grace_s` that the
    automation would have put back; the names of those put back."""
    counts = automation_run_counts(client)
    if not counts:
        return []
    now = now or datetime.now(timezone.utc)
    crashed = client.read_flow_runs(flow_run_filter=FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CRASHED])),
        tags=FlowRunFilterTags(all_=[PREEMPTIBLE])), limit=200)
    done = []
    for run in crashed:
        if crashed_for_s(run, now) < grace_for(run, grace_s):
            continue
        why = why_put_back(client, run, counts, grace_s)
        if why is None:
            continue
        ok, refused = put_back(client, run, "the stack's rescheduler", why)
        if ok:
            done.append(run.name)
            say(f"flow run {run.name} ({run.id}) Crashed {crashed_for_s(run, now):.0f} s ago ({run.state.message}): "
                f"rescheduled it, {why}")
        else:
            say(f"flow run {run.name} could not be rescheduled: {refused}")
    return done


def run_forever(sweeps: list[Callable[[Any], Any]], every_s: float, stop: threading.Event,
                say: Callable[[str], None]) -> None:
    """Run each sweep (given a client) every `every_s` until `stop`; a server
    that is away is waited for (said once per outage), as the workers wait for it."""
    from prefect.client.orchestration import get_client

    away = False
    while not stop.is_set():
        try:
            with get_client(sync_client=True) as client:
                for one in sweeps:
                    one(client)
            if away:
                say("the Prefect server answers again")
            away = False
        except Exception as err:  # the server away or restarting: try again next round
            if not away:
                say(f"the Prefect server does not answer ({type(err).__name__}: {err}); trying every {every_s:.0f} s")
            away = True
        stop.wait(every_s)


def say(message: str) -> None:
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} {message}", flush=True)


def serve(name: str, sweeps: list[Callable[[Any], Any]], every_s: float) -> None:
    """A process that sweeps until SIGTERM or Ctrl-C."""
    logging.getLogger("prefect").setLevel(logging.WARNING)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run_forever(sweeps, every_s, stop, say)
    say(f"{name}: stopped")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flows.reschedule", description=(
        "Put back crashed preemptible flow runs that gpt2-reschedule-preempted missed, as it would have."))
    p.add_argument("--grace-s", type=float, default=GRACE_S, help="how long a run must have stayed Crashed")
    p.add_argument("--every-s", type=float, default=SWEEP_EVERY_S, help="how often to look")
    args = p.parse_args(argv)
    say(f"rescheduler: every {args.every_s:.0f} s, runs Crashed over {args.grace_s:.0f} s")
    serve("rescheduler", [lambda client: sweep(client, args.grace_s, say=say)], args.every_s)
    sys.exit(0)


if __name__ == "__main__":
    main()
