"""The local stack's rescheduler (`python -m cli.stack.rescheduler`, a part
of `gpt2 stack up`): what a platform's controller does for the runs its
machines dropped, level-triggered, every 15 s.

- A crashed preemptible run the reschedule automation missed is put back as
  the automation would have (flows.reschedule.sweep).
- A run stranded in Pending is handed back to its pool: its worker took it
  (Pending, "Submitting") and died before the run's process started, so no
  worker will ever start it (a worker only takes Scheduled runs) and a parent
  waiting on it waits for its whole start timeout. On the stack a process
  worker starts a run's process within seconds, so a run still Pending that
  went Pending before its pool's current worker started was taken by a worker
  that is gone. Found by the fault soak (bench/soak/run.py): a worker SIGTERMed
  while it submitted a pipeline's data stage.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.states import Scheduled

from cli.stack import services
from flows import reschedule

STRANDED_GRACE_S = 2.0
"""A Pending run this much older than its pool's worker process. A worker
takes runs only seconds after its process starts (its imports), and the stack's
server and workers share one clock, so a run Pending since before that start
was taken by a worker that is gone; this margin is only the clocks' rounding.
(It was 30 s: a worker SIGTERMed while it submitted a run and restarted 8 s
later left that run Pending for good, found by the long fault soak.)"""


def workers_started(state_dir: Path) -> dict[str, datetime]:
    """When each pool's current worker process started (the stack's record)."""
    state = services.read_state(state_dir) or {"processes": []}
    return {p["name"][len("worker-"):]: datetime.fromtimestamp(p["started"], timezone.utc)
            for p in state["processes"] if p["name"].startswith("worker-")}


def stranded(run: FlowRun, started: dict[str, datetime], grace_s: float = STRANDED_GRACE_S) -> bool:
    """Pending since before its pool's current worker started: its worker is gone."""
    since = started.get(run.work_pool_name or "")
    return (run.state is not None and run.state.type == StateType.PENDING and since is not None
            and (since - run.state.timestamp).total_seconds() > grace_s)


def hand_back(client: Any, started: dict[str, datetime], say: Callable[[str], None]) -> list[str]:
    """Put every stranded run back to Scheduled, for its pool's worker to take."""
    pending = client.read_flow_runs(flow_run_filter=FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PENDING]))), limit=200)
    done = []
    for run in pending:
        if not stranded(run, started):
            continue
        ok, why = reschedule.propose(client, run, Scheduled(message=(
            "Handed back by the stack's rescheduler: the worker that took it stopped before the run started.")))
        if ok:
            done.append(run.name)
            say(f"flow run {run.name} ({run.id}) was Pending since {run.state.timestamp:%H:%M:%S}, before pool "
                f"{run.work_pool_name}'s worker started: handed it back to the pool")
        else:
            say(f"flow run {run.name} could not be handed back: {why}")
    return done


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m cli.stack.rescheduler", description=__doc__.split("\n\n")[0])
    p.add_argument("--state-dir", type=Path, required=True, help="the stack's directory")
    p.add_argument("--grace-s", type=float, default=reschedule.GRACE_S, help="how long a run must have stayed Crashed")
    p.add_argument("--every-s", type=float, default=reschedule.SWEEP_EVERY_S, help="how often to look")
    args = p.parse_args(argv)
    say = reschedule.say
    say(f"rescheduler: every {args.every_s:.0f} s, runs Crashed over {args.grace_s:.0f} s, runs stranded in Pending")
    reschedule.serve("rescheduler", [
        lambda client: reschedule.sweep(client, args.grace_s, say=say),
        lambda client: hand_back(client, workers_started(args.state_dir), say),
    ], args.every_s)
    sys.exit(0)


if __name__ == "__main__":
    main()
