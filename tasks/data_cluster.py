"""The tokenize step's work units on a Dask cluster, as Prefect tasks
(runtime.data_cluster; gpt2.data.units cuts the source into units).

    gpt2 prepare --preset gpt2-124m --root gs://bucket/gpt2 --set runtime.data_cluster=tcp://scheduler:8786
    gpt2 prepare --preset smoke --set runtime.data_cluster=local

Dask through prefect-dask rather than Ray through prefect-ray: both are pip
installs, but Dask is pure Python (no platform wheels to match across the
cluster), its integration is maintained with Prefect, a LocalCluster of real
worker processes starts in seconds in CI, and real clusters come from
`dask scheduler` / `dask worker`, dask-kubernetes or dask-gateway.

The tokenize step stays one cached Prefect task; `UnitExecutor.map` opens a
DaskTaskRunner for the step's duration only (a cached step never connects)
and submits one `tokenize-unit` task per unit, so each unit is a task run in
the UI under the step. Workers cannot write into this machine's work dir, so
they write under the artifact root (gpt2.root.layout.unit_staging_dir), which
every worker reaches; gpt2.data.tokenize fetches finished units from there.
A worker that dies mid-unit (killed, lost machine) costs that unit only:
Dask runs it again on another worker, and units are idempotent.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

import distributed
from prefect import get_client, task
from prefect.cache_policies import NO_CACHE
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect_dask import DaskTaskRunner

from gpt2.config.tree import Config
from gpt2.data import sources
from gpt2.data.process_pool import default_workers
from gpt2.data.units import tokenize_unit
from gpt2.data.work_unit import Unit, UnitResult
from gpt2.errors import UserError
from gpt2.root import layout
from tasks.common import not_user_error

log = logging.getLogger(__name__)

LOCAL = "local"
ADDRESS = re.compile(r"^(tcp|tls|ws|wss)://[^\s/:]+:\d+$")
SHARED_ROOTS = ("file", "gs", "s3", "gcs", "az", "abfs", "hdfs")
"""Root schemes the cluster's workers can write to (memory:// lives in one process)."""

IN_FLIGHT_PER_THREAD = 2
"""Units submitted per worker thread: each has its next unit queued when it
finishes one, and the scheduler never holds the whole plan."""


class DataClusterError(UserError, RuntimeError):
    """runtime.data_cluster is malformed, unreachable, or lost a unit; the message says which."""


def check_cluster_setting(config: Config) -> str | None:
    """The cluster address (or `local`), None without one; a clear error for
    a malformed one or a root the workers cannot share."""
    value = config.runtime.data_cluster
    if value is None:
        return None
    if value != LOCAL and not ADDRESS.match(value):
        raise DataClusterError(
            f"runtime.data_cluster={value!r} is not a Dask scheduler address: give `local` (a cluster of "
            "runtime.num_workers processes on this machine) or `tcp://host:8786`, or leave it unset"
        )
    scheme = layout.root(config).split("://", 1)[0]
    if scheme not in SHARED_ROOTS:
        raise DataClusterError(
            f"runtime.data_cluster={value!r} needs an artifact root its workers can write to; {layout.root(config)} "
            "is private to this process: use a local directory or a bucket (gs://, s3://)"
        )
    return value


def check_cluster(config: Config) -> None:
    """Fail before any work when runtime.data_cluster is malformed or its
    scheduler does not answer (within Dask's distributed.comm.timeouts.connect)."""
    address = check_cluster_setting(config)
    if address is None or address == LOCAL:
        return
    try:
        with distributed.Client(address, set_as_default=False):
            pass
    except (OSError, TimeoutError) as err:
        raise _unreachable(address, err) from err


def _unreachable(address: str, err: BaseException) -> DataClusterError:
    return DataClusterError(
        f"cannot reach the Dask scheduler at runtime.data_cluster={address!r} ({type(err).__name__}: {err}); "
        "start one (`dask scheduler`, then `dask worker <address>` on each machine), fix the address, "
        "or unset runtime.data_cluster to tokenize on this machine"
    )


def workers_read_source(config: Config) -> bool:
    """On a cluster, a remote data.source (gs://, s3://, hf://) is read by
    the workers, each its own units: nothing is downloaded to this machine,
    whose local copies a remote cluster's workers could not open anyway."""
    return config.runtime.data_cluster is not None and sources.is_remote(config.data.source)


def task_runner(config: Config) -> DaskTaskRunner:
    """A runner for runtime.data_cluster: a LocalCluster of single-threaded
    worker processes (tiktoken holds the GIL: threads do not scale), or a
    connection to a running scheduler."""
    address = check_cluster_setting(config)
    if address == LOCAL:
        workers = config.runtime.num_workers or default_workers()
        kwargs = dict(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0")
        return DaskTaskRunner(cluster_class=distributed.LocalCluster, cluster_kwargs=kwargs)
    return DaskTaskRunner(address=address)


@task(name="tokenize-unit", task_run_name="tokenize-unit-{unit.index}", cache_policy=NO_CACHE,
      persist_result=False, retries=2, retry_delay_seconds=5, retry_condition_fn=not_user_error)
def tokenize_unit_task(config: Config, unit: Unit, directory: str) -> UnitResult:
    return tokenize_unit(config, unit, directory)


class DaskUnitExecutor:
    """gpt2.data.tokenize's UnitExecutor on a Dask cluster: results as units
    finish, in any order, with a bounded number submitted at a time."""

    def __init__(self, config: Config):
        self.config = config
        self.address = check_cluster_setting(config)
        self.directory = layout.unit_staging_dir(config)

    def map(self, units: Iterable[Unit]) -> Iterator[UnitResult]:
        units = iter(units)
        with task_runner(self.config) as runner:
            client = self._connect(runner)
            api = _prefect_api()
            _check_workers_reach(client, api)
            log.info("tokenizing units on the Dask cluster at %s (%d worker threads); units go to %s",
                     client.scheduler.address, _threads(client), self.directory)
            pending: dict[distributed.Future, tuple[Unit, object]] = {}
            finished = distributed.as_completed(loop=client.loop)
            try:
                self._top_up(runner, api, units, pending, finished)
                for done in finished:
                    unit, future = pending.pop(done)
                    result = self._result(unit, future)
                    self._top_up(runner, api, units, pending, finished)
                    yield result
            finally:
                if pending:  # an error or an early stop (a token limit): drop what is queued
                    client.cancel(list(pending))

    def _connect(self, runner: DaskTaskRunner) -> distributed.Client:
        try:
            return runner.client
        except (OSError, TimeoutError) as err:
            raise _unreachable(self.address, err) from err

    def _top_up(self, runner: DaskTaskRunner, api: str, units: Iterator[Unit], pending: dict,
                finished: distributed.as_completed) -> None:
        window = max(IN_FLIGHT_PER_THREAD * _threads(runner.client), IN_FLIGHT_PER_THREAD)
        while len(pending) < window and (unit := next(units, None)) is not None:
            # The task's context travels with it: name the API explicitly, or a
            # worker would start a temporary server of its own where this run uses one.
            with temporary_settings(updates={PREFECT_API_URL: api}):
                future = runner.submit(tokenize_unit_task, {"config": self.config, "unit": unit,
                                                            "directory": self.directory})
            pending[future.wrapped_future] = (unit, future)
            finished.add(future.wrapped_future)

    def _result(self, unit: Unit, future) -> UnitResult:
        try:
            return future.result()
        except distributed.KilledWorker as err:
            raise DataClusterError(
                f"{unit} of data.source was running on Dask workers that died each time it ran ({err}); "
                "most often they ran out of memory: give the workers more memory or lower data.max_document_chars, "
                "then rerun (finished units are kept)"
            ) from None


def _prefect_api() -> str:
    """The Prefect API this run reports to: PREFECT_API_URL, or the temporary
    server Prefect started on this machine when none is set."""
    return str(get_client(sync_client=True).api_url)


def _check_workers_reach(client: distributed.Client, api: str) -> None:
    """Each unit is a task run that its worker reports to the Prefect API:
    say so now, naming the workers, when they cannot connect to it."""
    url = urlsplit(api)
    port = url.port or (443 if url.scheme == "https" else 80)
    failed = {worker: err for worker, err in client.run(_connect_error, url.hostname, port).items() if err}
    if failed:
        raise DataClusterError(
            f"Dask workers of runtime.data_cluster={client.scheduler.address!r} cannot reach this run's Prefect API "
            f"at {api} ({'; '.join(f'{w}: {e}' for w, e in sorted(failed.items()))}): each unit is a Prefect task "
            "run its worker reports there. Run a Prefect server they can reach and set PREFECT_API_URL (and "
            "PREFECT_API_AUTH_STRING) to it here; the workers are given the same"
        )


def _connect_error(host: str, port: int) -> str | None:
    """Run on each worker: why it cannot open a connection to host:port, None if it can."""
    try:
        socket.create_connection((host, port), timeout=10).close()
        return None
    except OSError as err:
        return f"{type(err).__name__}: {err}"


def _threads(client: distributed.Client) -> int:
    """Worker threads now in the cluster (it may grow or shrink while we run)."""
    return sum(client.nthreads().values())


def unit_executor(config: Config) -> DaskUnitExecutor | None:
    """The executor runtime.data_cluster asks for; None: this machine's pool."""
    return DaskUnitExecutor(config) if config.runtime.data_cluster is not None else None
