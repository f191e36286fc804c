"""Warm interpreters for the quick tier's trainer processes.

A tiny trainer run costs ~15 s of CPU as a fresh `python -m gpt2.train`, of
which ~9 s are imports (torch, torch._dynamo through the optimizer, MLflow,
matplotlib), and the tests start hundreds of such processes (trainers, torchrun
agents and ranks, pairs of gloo ranks). Here each pytest worker starts one or
two servers (server.py) that import all that once, and points `sys.executable`
at a proxy (proxy.py) that has a server fork the process instead: still a
process of its own (its own pid, gloo, signals, exit code, stdio), running
the real module as `__main__`, without the imports.

A test that signals or names the trainer itself (SIGSTOP, the pid a lease
names) asks `running_pid(proc)` for the process behind a proxy; tests where
the interpreter itself is the point (the tree of processes under a parent)
take the `fresh_python` fixture, which puts the real interpreter back for
them. The end-to-end tier keeps the warm interpreter for its multi-process
scenarios and the commands whose subject is what they do (marked `warm`,
tests/conftest.py::warm_module) and its shared stacks' workers, flow runs and
trainers (tests/flows/conftest.py); the rest of its processes (the fault
soak's stack, the quick start as written, the Ctrl-C scenarios, `gpt2 stack`'s
own tests) start as users' do, cold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# Modules the proxy hands to a server: the trainer, torchrun, a node of a
# multi-node run, the preflight and the CLI; and, for the end-to-end tier's
# shared stacks (tests/flows/conftest.py), the stack's Prefect worker (`-m
# cli.stack.worker`), the supervisor of each
# flow run it starts and the engine that runs the flow. Prefect itself is not
# preloaded (its settings are read at import): those children import it, and
# find torch and MLflow imported.
MODULES = ["gpt2.train", "torch.distributed.run", "gpt2.launch.node", "gpt2.preflight", "cli.main",
           "cli.stack.worker", "prefect.runner._workspace_supervisor", "prefect.engine"]


class WarmPython:
    """`servers` warm servers (~12 s of CPU each to start): two where runs of
    several ranks are many (their ranks alternate, each keeping a hash seed of
    its own), one elsewhere (a rank past the first then starts fresh)."""

    def __init__(self, directory: Path, real: str = sys.executable, servers: int = 2):
        self.directory, self.real = directory, real
        directory.mkdir(parents=True, exist_ok=True)
        self.sockets = [str(directory / f"server-{i}.sock") for i in range(servers)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.servers = []
        for i, path in enumerate(self.sockets):
            with open(directory / f"server-{i}.log", "w") as log:
                self.servers.append(subprocess.Popen([real, "-m", "tests.warm_python.server", path], cwd=REPO,
                                                     env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                     stderr=log))
        settings = {"python": real, "sockets": self.sockets, "modules": MODULES,
                    "servers": {path: server.pid for path, server in zip(self.sockets, self.servers)},
                    "log": str(directory / "fresh.log"), "env": dict(os.environ),
                    "children": str(directory / "children")}
        (directory / "children").mkdir(exist_ok=True)
        (directory / "warm.json").write_text(json.dumps(settings))
        # The proxy stands where the interpreter stood: beside links to the
        # rest of its bin directory, so `Path(sys.executable).with_name("gpt2")`
        # still finds the console scripts.
        bin_dir = Path(real).parent
        for entry in bin_dir.iterdir():
            if not entry.name.startswith("python") and not (directory / entry.name).exists():
                (directory / entry.name).symlink_to(entry)
        self.executable = str(directory / "python")
        source = (HERE / "proxy.py").read_text()
        Path(self.executable).write_text(f"#!{real} -IS\n{source}")
        os.chmod(self.executable, 0o755)

    @classmethod
    def shared(cls, directory: Path, servers: int) -> WarmPython:
        """The servers every pytest worker of a session uses (~12 s of CPU
        spared per worker past the first): the first worker to come starts
        them in `directory`, the others use them. Each holds a token while it
        may start processes; the starter, whose servers die with it, stops
        them only once no other worker holds one."""
        import fcntl

        directory.mkdir(parents=True, exist_ok=True)
        with open(directory.with_name(directory.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            settings = directory / "warm.json"
            if settings.exists():
                warm = cls.__new__(cls)
                known = json.loads(settings.read_text())
                warm.directory, warm.real, warm.sockets = directory, known["python"], known["sockets"]
                warm.executable, warm.servers = str(directory / "python"), []
            else:
                warm = cls(directory, servers=servers)
            (directory / "users").mkdir(exist_ok=True)
            warm.token = directory / "users" / str(os.getpid())
            written = directory / f"token-{os.getpid()}.tmp"  # whole when a stopping worker reads it
            written.write_text(_started(os.getpid()))
            os.replace(written, warm.token)
        return warm

    def stop(self) -> None:
        token = getattr(self, "token", None)
        if token is not None:
            token.unlink(missing_ok=True)
            if self.servers:
                self._wait_for_users(token.parent)
        for server in self.servers:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
        for server in self.servers:
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


    @staticmethod
    def _wait_for_users(users: Path) -> None:
        """Until every other worker let go of the servers or ended without
        saying so. No time limit: the servers die with this worker, so
        stopping them under a live one SIGKILLs its running processes (a
        module of multi-rank runs that came late in a long session did fail
        so, after a 900 s limit); a worker that hangs hangs the session anyway.
        A token names its worker by pid and start time, so a pid the system
        gave to another process since is not waited for."""
        import time

        while True:
            alive = []
            for token in users.iterdir():
                try:
                    if token.read_text() != _started(int(token.name)):
                        raise ProcessLookupError
                    alive.append(token)
                except (ProcessLookupError, ValueError, FileNotFoundError):
                    token.unlink(missing_ok=True)
            if not alive:
                return
            time.sleep(0.2)


def _warm_dir(proxy: str) -> Path | None:
    """The warm interpreter's directory where `proxy` is its proxy (its settings beside it), else None."""
    directory = Path(proxy).parent
    return directory if (directory / "warm.json").exists() else None


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name: [0] the state, [19] the
    start time (clock ticks since boot), which with the pid names one process for good."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _started(pid: int) -> str:
    """When the running process `pid` started. ProcessLookupError if none runs
    (a zombie, ended but not yet reaped by its parent, runs no more)."""
    try:
        fields = _stat(pid)
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    if fields[0] in ("Z", "X"):
        raise ProcessLookupError(pid)
    return fields[19]


def behind(pid: int, timeout: float = 60) -> int:
    """The process a running warm proxy `pid` stands for (its forked child), or
    `pid` itself where it is not a proxy: for a process found by pid rather
    than started here (a flow-run process a stack's worker started)."""
    directory = _proxy_dir(pid)
    if directory is None:
        return pid
    return _recorded_child(directory, pid, lambda: "ended" if _stat(pid)[0] in ("Z", "X") else None,
                           timeout)


def _proxy_dir(pid: int) -> Path | None:
    """The warm interpreter's directory where `pid` runs its proxy; None where it runs anything
    else, the real interpreter among them: a proxy that falls back to it (proxy.py's `fresh`, e.g.
    for an environment the servers did not import under) execs it in its own process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
    except FileNotFoundError:
        return None
    return _warm_dir(argv[2]) if len(argv) >= 3 and argv[1] == "-IS" else None


def running_pid(proc: subprocess.Popen, timeout: float = 60) -> int:
    """The pid of the process that runs what `proc` was started for: `proc`'s
    own with the real interpreter, the forked child a proxy stands for under a
    warm one (recorded by the proxy once the server forked it)."""
    directory = _warm_dir(sys.executable)
    if directory is None:
        return proc.pid
    return _recorded_child(directory, proc.pid,
                           lambda: None if proc.poll() is None else f"exit {proc.poll()}", timeout)


def _recorded_child(directory: Path, pid: int, ended, timeout: float) -> int:
    """The child the proxy `pid` of the warm interpreter in `directory` recorded, waiting for the
    record until `ended()` says how the proxy ended, or `timeout`."""
    import time

    record = directory / "children" / str(pid)
    started = _stat(pid)[19]  # (a proxy that has ended unreaped still has its start time)
    deadline = time.monotonic() + timeout
    while True:
        child, _, of = (record.read_text() if record.exists() else "").partition(" ")
        if of == started:  # this proxy's record, not one left by an earlier holder of its pid
            return int(child)
        if (how := ended()) or time.monotonic() > deadline:
            raise AssertionError(f"no process behind the warm proxy {pid} ({how or 'timed out'})")
        if _proxy_dir(pid) is None:  # it became the real interpreter: the process is its own
            return pid
        time.sleep(0.01)
