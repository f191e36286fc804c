"""tests/lanes.py: the end-to-end tier's lane worker runs only the lane groups,
the others never run them, and every test runs (a real pytest-xdist session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CONFTEST = """
import json, os
import pytest
from tests.lanes import LaneScheduling, name_groups

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    name_groups(config, items)

def pytest_xdist_make_scheduler(config, log):
    return LaneScheduling(config, log, lanes=("waits",))

@pytest.fixture(autouse=True)
def where(request):
    yield
    with open(os.environ["RAN"], "a") as out:
        out.write(json.dumps([request.node.nodeid, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
"""

TESTS = """
import time
import pytest

@pytest.mark.xdist_group("waits")
def test_waits():
    time.sleep(1.0)  # the other workers are handed their groups meanwhile

@pytest.mark.xdist_group("waits")
def test_waits_too():
    pass

@pytest.mark.parametrize("i", range(12))
def test_cpu(i):
    pass
"""


def _ran(pytester, monkeypatch, *args) -> dict[str, str]:
    ran = pytester.path / "ran.jsonl"
    monkeypatch.setenv("RAN", str(ran))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_groups=TESTS)
    result = pytester.runpytest_subprocess("-n", "3", "--dist", "loadgroup", "-p", "no:cacheprovider", *args)
    assert result.ret == 0, result.stdout.str()
    return {test.partition("@")[0]: worker for test, worker in map(json.loads, ran.read_text().splitlines())}


@pytest.mark.timeout(120)
def test_the_lane_worker_runs_the_lane_groups_and_nothing_else(pytester, monkeypatch):
    ran = _ran(pytester, monkeypatch)
    lane = {worker for test, worker in ran.items() if "test_waits" in test}
    assert lane == {"gw2"}, ran  # the last worker, both tests of the group
    others = {test: worker for test, worker in ran.items() if "test_waits" not in test}
    assert len(others) == 12 and "gw2" not in others.values(), ran
    assert set(others.values()) == {"gw0", "gw1"}, ran  # both shared the rest


@pytest.mark.timeout(120)
def test_with_no_lane_group_selected_the_lane_worker_stops_and_the_rest_run(pytester, monkeypatch):
    ran = _ran(pytester, monkeypatch, "-k", "cpu")
    assert len(ran) == 12 and "gw2" not in ran.values(), ran


def test_the_groups_the_tiers_name_exist():
    """A group is named for its module's file (tests.tiers): a name that matches none would send
    nothing first and give the lane nothing, silently (as "tests.bench.soak.test_soak" did)."""
    from tests.tiers import E2E_FIRST, E2E_LANE, STACK_A, STACK_B

    modules = {path.stem for path in (REPO / "tests").rglob("test_*.py")}
    assert set(E2E_FIRST + E2E_LANE) <= modules | {STACK_A, STACK_B}
