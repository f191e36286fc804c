"""The parent's wait loops woken by the server's events of the run they wait on.

A parent waiting on a stage reads the run every few seconds (flows.stages,
flows.ladder): a stage that ended just after a read was noticed up to a poll
later, ~4 s on average per stage at the 5 s poll, four or five stages a
pipeline. The server publishes every state change of a run as an event
(`prefect.flow-run.Completed`, ...), the way Prefect's own
`prefect.flow_runs.wait_for_flow_run` waits: `RunWakeup` subscribes to the
run's events in a thread of its own, and `wait(poll_s)` returns as soon as one
came. The loops still read the run themselves and keep their poll as the
longest wait, so a missed event (a subscription still connecting, a server
restarting, events out of service) costs at most the old poll, never a wrong
answer. No event stream where no Prefect API is set: Prefect would start a
server of its own for it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from typing import Any

from typing_extensions import Self

logger = logging.getLogger(__name__)

RETRY_S = 5.0
"""After the subscription failed (the server away, events not served), try again this much later."""


class RunWakeup:
    """`with RunWakeup(run_id) as wake: ... wake.wait(poll_s)`: returns True as
    soon as an event of the run came since the last wait (False after `poll_s`)."""

    def __init__(self, run_id: Any):
        self.run_id = str(run_id)
        self._came = threading.Event()
        self._closed = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self.events = 0
        """Events received so far (what the loop was woken by; 0 where none came)."""

    def __enter__(self) -> Self:
        from prefect.settings import PREFECT_API_URL

        if PREFECT_API_URL.value():
            # The thread sees the caller's Prefect settings (a context variable, not inherited by threads).
            context = contextvars.copy_context()
            self._thread = threading.Thread(target=context.run, args=(self._listen,), daemon=True,
                                            name=f"run-events-{self.run_id[:8]}")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait(self, seconds: float) -> bool:
        came = self._came.wait(seconds)
        self._came.clear()
        return came

    def close(self) -> None:
        self._closed.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop already ended
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _listen(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._task = loop.create_task(self._subscribe())
            if self._closed.is_set():  # closed before the task existed to be cancelled
                self._task.cancel()
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:  # closed
            pass
        except Exception as err:  # noqa: BLE001 - the poll carries on without events
            logger.debug("events of flow run %s: %s", self.run_id, err)
        finally:
            loop.close()

    async def _subscribe(self) -> None:
        from prefect.events.clients import get_events_subscriber
        from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

        only_this_run = EventFilter(event=EventNameFilter(prefix=["prefect.flow-run."]),
                                    resource=EventResourceFilter(id=[f"prefect.flow-run.{self.run_id}"]))
        while not self._closed.is_set():
            try:
                async with get_events_subscriber(filter=only_this_run, reconnection_attempts=2) as events:
                    self._came.set()  # subscribed: anything before this is what the next read sees
                    async for _ in events:
                        self.events += 1
                        self._came.set()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a server restarting, events not served: poll meanwhile
                logger.debug("events of flow run %s: %s: %s; polling meanwhile", self.run_id, type(err).__name__, err)
            await asyncio.sleep(RETRY_S)
