"""The stack server's event ordering (cli.stack.event_ordering) on a real,
migrated Prefect database: an event that the server running before this one
received counts as seen (a restart no longer holds its followers for 15
minutes), an event this server received and has not processed yet does not
(Prefect's ordering stands), nor does one it never received."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from prefect.server.database import provide_database_interface
from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

from cli.stack import event_ordering
from cli.stack.services import seed_prefect_db


async def _store(received) -> uuid.UUID:
    db = provide_database_interface()
    event_id = uuid.uuid4()
    run = f"prefect.flow-run.{uuid.uuid4()}"
    async with db.session_context(begin_transaction=True) as session:
        session.add(db.Event(id=event_id, occurred=received, received=received, recorded=received,
                             event="prefect.flow-run.Running", resource_id=run,
                             resource={"prefect.resource.id": run}, related_resource_ids=[], related=[],
                             payload={}, follows=None))
    return event_id


async def _seen(ordering, event_id) -> bool:
    return await ordering.event_has_been_seen(event_id)


def test_an_event_the_previous_server_received_counts_as_seen(tmp_path):
    seed_prefect_db(tmp_path / "prefect.db")
    started = event_ordering.STARTED
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"}):
        async def check():
            ordering = event_ordering.CausalOrdering(scope="test-restart")
            before = await _store(started - timedelta(minutes=1))  # received by the server before the restart
            after = await _store(started + timedelta(seconds=1))  # received by this one, not processed yet
            return [await _seen(ordering, e) for e in (before, after, uuid.uuid4())]

        assert asyncio.run(check()) == [True, False, False]
