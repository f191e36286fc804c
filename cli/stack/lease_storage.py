"""The local stack's Prefect server keeps its concurrency leases on disk, in
the stack's own directory, so a server restart keeps them.

A run of a GPU deployment holds a slot of the deployment's concurrency limit
(one GPU run at a time, prefect.yaml) under a lease that its flow renews
while it runs. Prefect's default lease storage
(prefect.server.concurrency.lease_storage.memory, Prefect 3.9) lives in the
server's memory, so a restarted server has lost every lease: the training
flow's next renewal fails and Prefect's engine cancels the run ("Concurrency
lease renewal failed - slots are no longer reserved. Terminating execution"),
and a run being started is Cancelled ("Deployment concurrency slot lost during
provisioning"), its slot still counted as taken. The fault soak found the
second (bench/soak/run.py). Prefect's own file-based storage keeps them; this
only puts its files under the stack's directory instead of ~/.prefect, so
two stacks (or a stack and another server) never read each other's leases.

The stack's server loads it through Prefect's own setting
(PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=cli.stack.lease_storage); a server
of your own can use Prefect's file-based storage the same way
(prefect.server.concurrency.lease_storage.filesystem), or Redis with several.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect.server.concurrency.lease_storage import filesystem

from cli.stack.services import LEASES_DIR_ENV


class ConcurrencyLeaseStorage(filesystem.ConcurrencyLeaseStorage):
    def __init__(self, storage_path: Path | None = None):
        where = os.environ.get(LEASES_DIR_ENV)
        super().__init__(storage_path or (Path(where) if where else None))
