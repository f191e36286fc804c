"""The local stack's Prefect workers (`python -m cli.stack.worker start --pool gpu --type process`):
Prefect's own `prefect worker` command, less its second report of a crash its runner already reported.

A process worker (Prefect 3.9) reports a flow run whose process died twice: its runner at once
("Process exited with status code: -9"), then the worker itself ("Flow run infrastructure exited
with non-zero status code -9") once the runner has also run the flow's on_crashed hooks, in a
fresh Python that imports the flow: seconds on a quiet machine, past 20 s on a busy one. The
reschedule automation puts a crashed run back after 20 s without news; a second report later
than that lands on the attempt it started and crashes it before it runs (seen on a loaded
2-core machine: the run trained three times instead of two, a GPU start wasted). Prefect's runner
records whether its report landed (FlowRunExecutionResult.crash_unreported); its process worker
drops that flag. Here the worker keeps it, and reports a crash itself only when its runner
could not: the same reports, each once.

The guard wraps two private parts of Prefect; where a release lacks them it says so once and
the worker runs as Prefect's own (the automation's wait remains the only protection).
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from typing import Any
from uuid import UUID

log = logging.getLogger("gpt2.stack.worker")

_reported: Counter[UUID] = Counter()
"""Flow runs whose process died and whose crash the runner has reported, not yet passed to the worker."""


def install() -> bool:
    """Wrap the runner's execution and the worker's crash report; False (and a warning) where this
    Prefect lacks either."""
    try:
        from prefect.runner._flow_run_executor import FlowRunExecutor
        from prefect.workers.base import BaseWorker

        submit, propose = FlowRunExecutor.submit, BaseWorker._propose_crashed_state
    except (ImportError, AttributeError) as err:
        log.warning("this Prefect lacks what the worker's crash-report guard wraps (%s): a crash is reported "
                    "twice, as Prefect does", err)
        return False
    if getattr(submit, "_gpt2_guard", False):
        return True

    async def guarded_submit(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await submit(self, *args, **kwargs)
        if result is not None and result.status_code not in (0, None) and not result.crash_unreported:
            _reported[self._flow_run.id] += 1
        return result

    async def guarded_propose(self: Any, flow_run: Any, message: str, *args: Any, **kwargs: Any) -> None:
        if _reported[flow_run.id] > 0:
            _reported[flow_run.id] -= 1
            if not _reported[flow_run.id]:
                del _reported[flow_run.id]  # a long-lived worker keeps no key per crash it saw
            self.get_flow_run_logger(flow_run).info(
                "not reporting the crash again (%s): the runner reported it, and a late second report "
                "could land on the run's next attempt", message)
            return
        await propose(self, flow_run, message, *args, **kwargs)

    guarded_submit._gpt2_guard = True  # type: ignore[attr-defined]
    FlowRunExecutor.submit = guarded_submit  # type: ignore[method-assign]
    BaseWorker._propose_crashed_state = guarded_propose  # type: ignore[method-assign]
    return True


def main() -> None:
    install()
    from prefect.cli import app

    sys.argv = ["prefect", "worker", *sys.argv[1:]]
    app()


if __name__ == "__main__":
    main()
