"""`pytest --cpu-report=N`: the N tests that cost the most CPU, the total, and the tests'
summed durations (the tier's wall time is .ci/run's to print).

The quick tier is CPU-bound on a 2-core machine, so a test's wall time (what
--durations shows) says little about what it costs the others: a test that
waits on a server is cheap, one whose trainer ranks fill both cores is not.
Counted per test: the CPU seconds of the pytest worker and of every process
under it (trainers, warm interpreters' children, servers, Dask workers), as
/proc gives them (the live ones' own time plus what the ones they reaped
used). A process that outlives its parent and is reaped elsewhere is missed.
"""

from __future__ import annotations

import os

import pytest

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def pytest_addoption(parser):
    parser.addoption("--cpu-report", type=int, default=0, metavar="N",
                     help="print the N tests that used the most CPU (their process and every process under it)")


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its descendants (Linux /proc; 0 elsewhere)."""
    procs: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                data = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = data[data.rindex(")") + 2:].split()
        # utime, stime, cutime, cstime: fields 14-17 of stat(5), 12-15 after the name.
        procs[int(name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += procs.get(pid, (0, 0))[1]
        stack.extend(children.get(pid, []))
    return total / _TICK


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.config.getoption("cpu_report"):
        item._cpu_start = tree_cpu_s(os.getpid())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Before the teardown's report is made, so it carries the figure (to the
    # xdist controller too, which prints the summary).
    if call.when == "teardown" and hasattr(item, "_cpu_start"):
        item.user_properties.append(("cpu_s", tree_cpu_s(os.getpid()) - item._cpu_start))
    yield


class _Collector:
    def __init__(self, top: int):
        self.top, self.costs, self.durations = top, [], {}

    def pytest_runtest_logreport(self, report):
        # Setup, call and teardown of every test: the tier's summed durations (beside its wall time).
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        if report.when == "teardown":
            self.costs += [(value, report.nodeid) for key, value in report.user_properties if key == "cpu_s"]

    def pytest_terminal_summary(self, terminalreporter):
        if not self.costs:
            return
        terminalreporter.write_sep("=", f"{min(self.top, len(self.costs))} tests that used the most CPU")
        for cpu, nodeid in sorted(self.costs, reverse=True)[:self.top]:
            terminalreporter.write_line(f"{cpu:8.1f}s cpu  {nodeid}")
        terminalreporter.write_line(f"{sum(c for c, _ in self.costs):8.1f}s cpu  in all {len(self.costs)} tests")
        terminalreporter.write_line(f"{sum(self.durations.values()):8.1f}s summed durations (setup, call, teardown) "
                                    f"of {len(self.durations)} tests")


def pytest_configure(config):
    top = config.getoption("cpu_report")
    if top and not hasattr(config, "workerinput"):  # the controller (or a run without xdist) prints
        config.pluginmanager.register(_Collector(top), "cpu-report-collector")
