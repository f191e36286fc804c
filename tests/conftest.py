"""Shared fixtures: a real temporary Prefect server, offline settings, tmp roots."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

# No network here or in CI: no telemetry, no hub lookups.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
# Read by gcsfs at import: otherwise it probes bucket types over gRPC, which
# the GCS emulator does not answer, and stalls.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Compiled modules kept, as Python keeps them by default. Where the environment turns that off
# (PYTHONDONTWRITEBYTECODE), every process the tiers start (pytest's workers, trainers, the stacks'
# flow runs and CLIs) compiled every module of ours from source again, and each worker rewrote every
# test module again: a worker's collection took 8.3 s instead of 5.3 s.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# Under pytest -n, each worker's torch (and the trainers it starts) gets one
# intra-op thread: workers already fill the cores, and OpenMP threads of
# several processes spinning on the same cores slow every one of them down.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from gpt2.config.overrides import resolve_config  # noqa: E402

pytest_plugins = ["pytester", "tests.cpu_report"]  # tests of our own fixtures (test_outbox); --cpu-report=N


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the default): in the quick tier a worker more than the cores. Many tests spend
    part of their time waiting (on a server, an automation, a sleeping process), and a third
    worker keeps both cores of a 2-core machine busy (measured: 218 s on 2 workers, 191 s on 3,
    199 s on 4). The end-to-end tier a worker a core: its work is CPU (every flow run and trainer
    a stack starts imports torch, Prefect and MLflow cold), and 4 workers on 2 cores made each
    test ~1.6 times slower, the tier only 9 % faster, and two timing-sensitive scenarios flaky.
    Cores as the data stage counts them: those this process may run on."""
    from gpt2.data.process_pool import default_workers

    return default_workers() if _e2e_session(config) else default_workers() + 1


E2E_TIMEOUT_S = 600
"""An end-to-end test's limit (pyproject's `timeout`, 90 s, is the quick tier's): a hang fails in
minutes and names the test. A test that needs longer says so with its own `pytest.mark.timeout`."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """End-to-end tests get E2E_TIMEOUT_S unless they set their own. And `--dist loadgroup` on
    pytest 9: pytest-xdist 3.8 puts a test's group into `item._nodeid`, which pytest 9 no longer
    reads (Item.nodeid comes from `item._id`), so its scheduler never saw a group. The same suffix,
    where pytest 9 reads it, on the workers (which collect; the controller does not)."""
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))
    if _e2e_session(config):
        _e2e_order(items)
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)


def _e2e_order(items) -> None:
    """The end-to-end tier under `--dist loadgroup`: a module whose tests name no group is one
    group (its module-scoped fixtures, a cluster or a stack, start once, as under `loadfile`), and
    the longest groups (tests.tiers.E2E_FIRST) come first in the collection. pytest-xdist's default
    `--loadscope-reorder` then sends the groups out by their number of tests, so that order decides
    only among groups of as many tests (the soak, one test, goes out late). Sending them out in
    E2E_FIRST's order instead gained nothing measured (#59: 2,858 s against 2,859 s, both cores
    ~95 % busy either way)."""
    for item in items:
        if hasattr(item, "module") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    from tests.tiers import E2E_FIRST

    def rank(item) -> int:
        groups = {m.args[0] if m.args else m.kwargs.get("name") for m in item.iter_markers("xdist_group")}
        return min((E2E_FIRST.index(g) for g in groups if g in E2E_FIRST), default=len(E2E_FIRST))

    items.sort(key=rank)  # stable: within a group, the tests keep their order


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """What this process still holds goes with it at exit: frozen, it is left
    out of the interpreter's final collection, which walks every object (~3 s
    a process, more for a worker that imported torch, Prefect and MLflow, and
    the controller waits for every worker's)."""
    import gc

    gc.freeze()


def _e2e_session(config) -> bool:
    return config.getoption("markexpr") == "e2e"


# The warm interpreter that `sys.executable` points at now (None: the real one).
_warm_active = None


@contextlib.contextmanager
def _executable_of(warm):
    """`sys.executable` is `warm`'s proxy inside the block."""
    global _warm_active
    real, sys.executable, _warm_active = sys.executable, warm.executable, warm
    try:
        yield warm
    finally:
        sys.executable, _warm_active = real, None


@pytest.fixture(scope="session")
def warm_interpreter(request, tmp_path_factory):
    """The warm servers (tests/warm_python) this pytest worker uses: under
    pytest-xdist one set for all the session's workers, started by the first
    (WarmPython.shared), else its own; stopped with the session. None with
    GPT2_TESTS_FRESH_PYTHON=1 (every process then starts cold, as users' do)."""
    if os.environ.get("GPT2_TESTS_FRESH_PYTHON") == "1":
        yield None
        return
    from tests.warm_python import WarmPython

    # The end-to-end tier's warm modules are the runs of several ranks; the quick tier keeps few.
    servers = 2 if _e2e_session(request.config) else 1
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one set for the session's workers: their common basetemp
        warm = WarmPython.shared(tmp_path_factory.getbasetemp().parent / "warm-python", servers)
    else:
        warm = WarmPython(tmp_path_factory.mktemp("warm-python"), servers=servers)
    try:
        yield warm
    finally:
        warm.stop()


@pytest.fixture(scope="session", autouse=True)
def warm_python(request):
    """The quick tier's processes start from the warm interpreter:
    `sys.executable` is its proxy for the whole session. In the end-to-end tier
    only its modules of multi-process scenarios (marked `warm`) are warm, for
    their duration (`warm_module`), and the shared stacks' processes
    (tests/flows/conftest.py); the rest start as users' do."""
    warm = None if _e2e_session(request.config) else request.getfixturevalue("warm_interpreter")
    if warm is None:
        yield None
        return
    with _executable_of(warm):
        yield warm


_WARM_MODULES = pytest.StashKey[set]()


def pytest_collection_finish(session):
    """The modules that have tests marked `warm` among those this session runs.
    Then the heap as collection leaves it (torch, Prefect, MLflow and every test
    module imported) moves to the permanent generation: a full `gc.collect()`
    (the micro-batch probe's `gpt2.train.memory.release` after each try, hundreds
    in the quick tier) then walks only what the tests made since, not the
    ~0.4 million objects of the imports (~0.25 s a collection)."""
    session.config.stash[_WARM_MODULES] = {item.module.__name__ for item in session.items
                                           if item.get_closest_marker("warm") and hasattr(item, "module")}
    _freeze_imports()


REFREEZE_AFTER_IMPORTS = 50
"""New modules imported since the last freeze past which a test module's start freezes again."""
_frozen_at = [0]


def _freeze_imports() -> None:
    """What is alive now (collected first, so no garbage goes with it) to the permanent generation."""
    import gc

    gc.collect()
    gc.freeze()
    _frozen_at[0] = len(sys.modules)


@pytest.fixture(scope="module", autouse=True)
def refreeze_imports():
    """The tests import most of the heavy libraries themselves, after collection: MLflow, Prefect's
    server, transformers, lm-eval (~0.3 million objects more). Unfrozen, they made every full
    collection of the worker cost ~0.3 s instead of ~0.1 (the probe's `release` after each try,
    and Python's own full collections as the tests allocate). So a module that starts after
    REFREEZE_AFTER_IMPORTS new imports freezes the heap again, as collection's end does (measured
    on tests/gpt2/train, eval and tasks, one process: 12.9 s of full collections became 4.2 s, the
    freezes included). Objects made by the tests themselves stay collectable as before."""
    if len(sys.modules) - _frozen_at[0] >= REFREEZE_AFTER_IMPORTS:
        _freeze_imports()
    yield


@pytest.fixture(scope="module", autouse=True)
def warm_module(request):
    """In the end-to-end tier, a module with tests marked `warm` (multi-process
    scenarios moved out of the quick tier, not on a stack) runs from the warm
    interpreter as it did there. Module-scoped and autouse, so it is in place
    before the module's own fixtures start their processes."""
    if (_warm_active is not None or not _e2e_session(request.config)
            or request.module.__name__ not in request.config.stash.get(_WARM_MODULES, set())):
        yield
        return
    warm = request.getfixturevalue("warm_interpreter")
    if warm is None:
        yield
        return
    with _executable_of(warm):
        yield


@pytest.fixture(autouse=True)
def outboxes_stop_with_their_test():
    """A tracker a test left open stops sending when the test ends: its
    thread would otherwise go on retrying a server the test already stopped,
    and log after pytest closed the stream it logs to ("--- Logging error ---")."""
    from gpt2.tracking import outbox

    before = set(map(id, outbox.running()))
    yield
    for box in outbox.running():
        if id(box) not in before:
            box.stop()


@pytest.fixture
def fresh_python(monkeypatch):
    """For a test where the interpreter itself is the point (the pid it
    compares, SIGSTOP, the tree of processes under a parent): the real one."""
    if _warm_active is not None:
        monkeypatch.setattr(sys, "executable", _warm_active.real)


@pytest.fixture
def warm_spawn(monkeypatch):
    """multiprocessing's spawned children (gloo ranks started with mp.spawn)
    from the warm interpreter too: `-c` code through the proxy."""
    warm = _warm_active
    if warm is None:
        yield
        return
    import multiprocessing

    monkeypatch.setenv("WARM_PYTHON_C", "1")
    multiprocessing.set_executable(warm.executable)
    try:
        yield
    finally:
        multiprocessing.set_executable(warm.real)


@pytest.fixture(scope="session")
def prefect_server():
    """A real temporary Prefect server (SQLite) for the whole session; yields its API URL."""
    import tempfile
    from unittest import mock

    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    from cli.common import TEMPORARY_SERVER_QUICK_START
    from cli.stack.services import seed_prefect_db

    def seeded_dir() -> str:
        # The harness puts its database in a fresh temporary directory: one that
        # already holds it migrated (as `gpt2 stack up` seeds its own) spares
        # each pytest worker ~25 s of Prefect's migrations at startup.
        path = tempfile.mkdtemp()
        seed_prefect_db(Path(path) / "prefect-test.db")
        return path

    # Its server registers no block types at start, as the CLI's temporary server
    # (cli.common.TEMPORARY_SERVER_QUICK_START): the tests save only gpt2's own
    # blocks, which register their types as they are saved. Set only while the
    # server starts: it reads them there.
    quiet_start = mock.patch.dict(os.environ, TEMPORARY_SERVER_QUICK_START)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("prefect.testing.utilities.mkdtemp", seeded_dir))
        with quiet_start:
            stack.enter_context(prefect_test_harness(server_startup_timeout=120))
        yield PREFECT_API_URL.value()


@pytest.fixture
def s3_server(monkeypatch):
    """A real S3 API server on loopback (moto's server mode), used through s3fs
    with fsspec's defaults, as `gs://` is through the GCS emulator; yields a root URL."""
    pytest.importorskip("s3fs")
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(exe):
        pytest.skip("moto's server is not installed (pip install -e .[dev])")
    port = _free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": f"http://127.0.0.1:{port}"})
        fsspec.filesystem("s3").clear_instance_cache()
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir("gpt2-test-bucket")
        yield "s3://gpt2-test-bucket/prefix"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def smoke_config(tmp_path):
    """Factory: the smoke preset rooted in this test's tmp dir, plus overrides."""

    def make(**overrides):
        values = {"runtime.work_dir": str(tmp_path / "work"), **overrides}
        return resolve_config("smoke", values, root=str(tmp_path / "root"))

    return make


def write_jsonl(path: Path, docs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    return path


@pytest.fixture
def prose_docs():
    """Real English prose split into ~500 paragraph documents (Python's own docs)."""
    from pydoc_data.topics import topics

    docs = []
    for key in sorted(topics):
        docs += [p for p in topics[key].split("\n\n") if len(p.strip()) > 40]
    return [{"text": t, "id": i} for i, t in enumerate(docs)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, seconds: float = 30) -> None:
    """Until a server on loopback accepts connections (at most `seconds`)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)


@pytest.fixture
def gcs_emulator(monkeypatch):
    """A real GCS JSON-API emulator on loopback, used through gcsfs."""
    pytest.importorskip("gcsfs")
    exe = os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    if not os.path.exists(exe):
        pytest.skip("gcp-storage-emulator is not installed (pip install -e .[dev])")
    port = _free_port()
    proc = subprocess.Popen([exe, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
        fsspec.filesystem("gcs").clear_instance_cache()
        fs = fsspec.filesystem("gcs", skip_instance_cache=True)
        fs.mkdir("gpt2-test-bucket")
        yield "gs://gpt2-test-bucket/prefix"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
