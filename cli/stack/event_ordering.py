"""The local stack's Prefect server processes each event only after the event
it follows, as Prefect does, and remembers across a restart what it had seen.

Prefect's own ordering (prefect.server.events.ordering.memory, Prefect 3.9)
keeps in memory the events its triggers have processed. A restarted server
has forgotten them, so an event that follows one from before the restart (a
flow run's Crashed after its Running) waits until the ordering gives up on
its leader, 15 minutes later: the reschedule-after-preemption automation then
acts 15 minutes late, and a pipeline whose parent crashed in that window sits
Crashed for as long. Here an event counts as seen also when the server that
ran before this one received it (it is in the events table, received before
this server started): what a restart forgot, the database remembers.

The stack's server loads it through Prefect's own setting
(PREFECT_SERVER_EVENTS_CAUSAL_ORDERING=cli.stack.event_ordering); a server of
your own can load it the same way (docs/fault-soak.md).
"""

from __future__ import annotations

from datetime import datetime, timezone
from uuid import UUID

import sqlalchemy as sa
from prefect.server.database import provide_database_interface
from prefect.server.events.ordering import memory
from prefect.server.events.schemas.events import Event

STARTED = datetime.now(timezone.utc)
"""When this server process loaded the ordering (at its start)."""


async def received_before(event_id: UUID, started: datetime) -> bool:
    """The event is in the server's events table, received before `started`."""
    db = provide_database_interface()
    async with db.session_context() as session:
        received = await session.scalar(sa.select(db.Event.received).where(db.Event.id == event_id))
    if received is None:
        return False
    if received.tzinfo is None:  # SQLite hands back naive UTC
        received = received.replace(tzinfo=timezone.utc)
    return received < started


class CausalOrdering(memory.CausalOrdering):
    async def event_has_been_seen(self, event: UUID | Event) -> bool:
        if await super().event_has_been_seen(event):
            return True
        return await received_before(event.id if isinstance(event, Event) else event, STARTED)
