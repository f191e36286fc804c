"""runtime.data_cluster: the data stage's work units as Prefect tasks on a
real Dask cluster of separate worker processes (a LocalCluster started here,
reached by its tcp:// address as a remote one would be). The shards are
byte-identical to a one-machine run's; a worker killed mid-run costs only its
unit; a bad address is a clear error naming the setting."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpt2.config.overrides import resolve_config
from gpt2.data.manifest import load_manifest
from gpt2.data.sources import resolve
from gpt2.data.units import plan_units
from gpt2.errors import UserError
from gpt2.root import layout, storage
from tests.conftest import write_jsonl
from tests.tiers import SCENARIO

distributed = pytest.importorskip("distributed")
# One pytest worker runs the module: its reference run and its cluster are made once.
pytestmark = [*SCENARIO, pytest.mark.xdist_group("data_cluster")]

PART_TOKENS = 20_000
"""Small units (about 70 kB of JSONL each), so the corpus makes several."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from pydoc_data.topics import topics

    docs = []
    for key in sorted(topics):
        docs += [p for p in topics[key].split("\n\n") if len(p.strip()) > 40]
    return write_jsonl(tmp_path_factory.mktemp("source") / "corpus.jsonl", [{"text": t} for t in docs])


def _args(base, corpus, **overrides) -> dict:
    values = {"data.source": str(corpus), "runtime.work_dir": str(base / "work"),
              "runtime.tokenize_part_tokens": PART_TOKENS, **overrides}
    return dict(preset="smoke", overrides=values, root=str(base / "root"))


def _shards(manifest_url: str) -> dict[str, bytes]:
    manifest = load_manifest(manifest_url)
    return {s.path: storage.read_bytes(layout.shard(manifest_url, s.path)) for s in manifest.shards}


@pytest.fixture(scope="module")
def one_machine(prefect_server, corpus, tmp_path_factory):
    """The reference: the same source tokenized by this machine's own pool."""
    from flows.data import data_flow

    result = data_flow(**_args(tmp_path_factory.mktemp("one-machine"), corpus))
    return load_manifest(result["manifest"]), _shards(result["manifest"])


@pytest.fixture(scope="module")
def dask_cluster():
    """Two worker processes of one thread each, behind a scheduler on loopback:
    one cluster for the module's tests, as one remote cluster serves many runs
    (a worker's first unit pays its imports, ~10 s of CPU). The test that kills
    a worker comes last; its nanny starts a new one in any case."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2)
            yield cluster, client


def _same_as_one_machine(result: dict, one_machine) -> None:
    manifest, shards = one_machine
    assert load_manifest(result["manifest"]).model_dump() == manifest.model_dump()
    assert _shards(result["manifest"]) == shards


def _unit_runs(flow_run_id) -> list[str]:
    """Names and states of the tokenize-unit task runs of one flow run, from the Prefect API."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="tokenize-unit-")),
        )
    return sorted(f"{r.name}:{r.state.type.value}" for r in runs)


def test_cluster_run_gives_the_one_machine_shards(prefect_server, corpus, one_machine, dask_cluster, tmp_path):
    from flows.data import data_flow

    cluster, _ = dask_cluster
    args = _args(tmp_path, corpus, **{"runtime.data_cluster": cluster.scheduler_address})
    state = data_flow(**args, return_state=True)
    result = state.result()
    assert result["cached"] is False
    _same_as_one_machine(result, one_machine)
    # Every unit ran as its own Prefect task on the cluster.
    config = resolve_config(args["preset"], args["overrides"], root=args["root"])
    units = plan_units(resolve(config.data), PART_TOKENS)
    assert len(units) >= 4
    assert _unit_runs(state.state_details.flow_run_id) == sorted(
        f"tokenize-unit-{u.index}:COMPLETED" for u in units)
    # The workers' staging area under the root goes once the shards are there.
    assert not storage.exists(layout.unit_staging_dir(config))
    assert data_flow(**args)["cached"] is True


# the CLI process, its temporary Prefect server and a Dask cluster of worker processes
def test_cli_local_cluster_on_prefect_temporary_server(corpus, one_machine, tmp_path):
    """`gpt2 prepare --set runtime.data_cluster=local` with no PREFECT_API_URL:
    the units report to the temporary server Prefect starts for the run, which
    the workers are told about (each would start a server of its own otherwise)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONUNBUFFERED="1",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300")  # a busy machine starts it slowly
    args = _args(tmp_path, corpus, **{"runtime.data_cluster": "local", "runtime.num_workers": 2})
    sets = [a for key, value in args["overrides"].items() for a in ("--set", f"{key}={value}")]
    proc = subprocess.run([str(Path(sys.executable).with_name("gpt2")), "prepare", "--preset", "smoke",
                           "--root", args["root"], *sets, "--json"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    _same_as_one_machine(json.loads(proc.stdout.strip().splitlines()[-1]), one_machine)
    # The workers' task runs (their logs reach our stderr) and a single temporary server.
    assert "Task run 'tokenize-unit-0' - Finished in state Completed()" in proc.stderr
    assert proc.stderr.count("Starting temporary server") == 1


# a cluster of its own (workers that see the bucket emulator), ~40 s of CPU
def test_bucket_source_and_root_read_and_written_by_the_workers(prefect_server, corpus, one_machine, gcs_emulator,
                                                                 monkeypatch, tmp_path):
    """Source and root in a bucket (a real GCS JSON API on loopback), as on a
    real cluster: the workers read their own byte ranges from the bucket and
    write their units under the root; nothing is downloaded here."""
    import fsspec

    from flows.data import data_flow

    monkeypatch.setenv("FSSPEC_GCS_TOKEN", "anon")  # the workers do not share this process's fsspec.config
    fsspec.filesystem("gcs").put_file(str(corpus), f"{gcs_emulator}/corpus.jsonl")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        args = _args(tmp_path, corpus, **{"data.source": f"{gcs_emulator}/corpus.jsonl",
                                          "runtime.data_cluster": cluster.scheduler_address})
        args["root"] = f"{gcs_emulator}/root"
        result = data_flow(**args)
    config = resolve_config(args["preset"], args["overrides"], root=args["root"])
    manifest, shards = one_machine
    assert load_manifest(result["manifest"]).shards == manifest.shards
    assert _shards(result["manifest"]) == shards
    assert not layout.data_step_dir(config, "download").exists()
    assert not storage.exists(layout.unit_staging_dir(config))


def _kill_a_busy_worker(client, killed: list, stop: threading.Event) -> None:
    """SIGKILL the process of the first worker seen running a unit."""
    pids = client.run(os.getpid)  # worker address -> its process id
    while not stop.is_set():
        busy = [address for address, keys in client.processing().items() if keys]
        if busy:
            os.kill(pids[busy[0]], signal.SIGKILL)
            killed.append(busy[0])
            return
        time.sleep(0.005)


# a cluster of its own (no retry after a death), ~40 s of CPU
def test_unit_whose_workers_die_each_time_is_named_and_the_rerun_completes(prefect_server, corpus, one_machine,
                                                                          tmp_path):
    import dask

    from flows.data import data_flow
    from tasks.data_cluster import DaskUnitExecutor

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):  # the first death is final
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    with cluster, distributed.Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2)
        args = _args(tmp_path, corpus, **{"runtime.data_cluster": cluster.scheduler_address})
        config = resolve_config(args["preset"], args["overrides"], root=args["root"])
        killed: list[str] = []
        killer = threading.Thread(target=_kill_a_busy_worker, args=(client, killed, threading.Event()), daemon=True)
        killer.start()
        lost = r"unit \d+ \(corpus\.jsonl bytes \d+-\d+\) of data\.source was running on Dask workers that died"
        with pytest.raises(UserError, match=lost):
            list(DaskUnitExecutor(config).map(plan_units(resolve(config.data), PART_TOKENS)))
        killer.join()
        assert killed
        _same_as_one_machine(data_flow(**args), one_machine)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_address_names_the_setting(prefect_server, corpus, tmp_path):
    import dask

    from flows.data import data_flow

    nobody = f"tcp://127.0.0.1:{_free_port()}"
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        with pytest.raises(UserError, match=r"cannot reach the Dask scheduler at runtime\.data_cluster="):
            data_flow(**_args(tmp_path, corpus, **{"runtime.data_cluster": nobody}))
    with pytest.raises(UserError, match=r"runtime\.data_cluster='scheduler' is not a Dask scheduler address"):
        data_flow(**_args(tmp_path, corpus, **{"runtime.data_cluster": "scheduler"}))
    assert not (tmp_path / "work" / "data").exists()  # refused before any work


def test_workers_that_cannot_reach_the_prefect_api_are_named(dask_cluster):
    from tasks.data_cluster import _check_workers_reach

    _, client = dask_cluster
    nobody = f"http://127.0.0.1:{_free_port()}/api"
    expected = r"Dask workers of runtime\.data_cluster=.* cannot reach this run's Prefect API"
    with pytest.raises(UserError, match=expected) as err:
        _check_workers_reach(client, nobody)
    assert all(worker in str(err.value) for worker in client.scheduler_info()["workers"])


def test_killed_worker_costs_only_its_unit(prefect_server, corpus, one_machine, dask_cluster, tmp_path):
    from flows.data import data_flow

    cluster, client = dask_cluster
    killed: list[str] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_a_busy_worker, args=(client, killed, stop), daemon=True)
    killer.start()
    try:
        result = data_flow(**_args(tmp_path, corpus, **{"runtime.data_cluster": cluster.scheduler_address}))
    finally:
        stop.set()
        killer.join()
    assert killed, "no worker was seen running a unit"
    assert killed[0] not in client.scheduler_info()["workers"]  # really gone (its nanny started a new one)
    # Dask ran the lost unit again on a live worker; the run did not fail.
    _same_as_one_machine(result, one_machine)
