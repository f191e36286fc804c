"""Background services for `gpt2 stack`: start detached, record, check, stop.

Each service runs in its own session (process group) so that stopping it also
stops what it spawned (uvicorn workers, flow-run processes) and nothing else.
A record keeps the pid with the process's start time, so a pid the system
reused for something else is never signalled.

    rec = start("mlflow", ["mlflow", "server", ...], env, cwd, log_dir)
    wait_http(rec, "http://127.0.0.1:5000/health", timeout=90)
    stop(rec)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil


class ServiceError(RuntimeError):
    """A service did not come up; the message ends with its log's tail."""


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, cmd: list[str], env: dict[str, str], cwd: Path, log_dir: Path) -> dict[str, Any]:
    """Start `cmd` detached (new session, stdin closed, output to `<log_dir>/<name>.log`)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return {"name": name, "pid": proc.pid, "started": psutil.Process(proc.pid).create_time(),
            "cmd": cmd, "log": str(log)}


def process(rec: dict[str, Any]) -> psutil.Process | None:
    """The recorded process if it is still the same one and not a zombie."""
    try:
        proc = psutil.Process(rec["pid"])
        if abs(proc.create_time() - rec["started"]) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.NoSuchProcess:
        return None


def alive(rec: dict[str, Any]) -> bool:
    return process(rec) is not None


def _tree(leader: psutil.Process) -> list[psutil.Process]:
    """The leader, its descendants (a worker's flow-run processes may start
    sessions of their own) and its process group's other members (orphans)."""
    found = {p.pid: p for p in [leader, *leader.children(recursive=True)]}
    for proc in psutil.process_iter():
        try:
            if proc.pid not in found and os.getpgid(proc.pid) == leader.pid:
                found[proc.pid] = proc
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return list(found.values())


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


STOP_S = 20.0
"""How long a server (Prefect, MLflow) gets between SIGTERM and SIGKILL."""


def stop(rec: dict[str, Any], timeout: float = STOP_S, alone_s: float | None = None) -> list[str]:
    """SIGTERM the service and everything it started, SIGKILL what is left
    after `timeout` (returns as soon as all of it has exited); with `alone_s`,
    after that long once only the service itself is left (a worker's window
    is for its flow runs' checkpoints: with none left there is nothing to
    wait for). Returns what had to be SIGKILLed (`pid status cmdline`), so a
    slow stop says why."""
    leader = process(rec)
    if leader is None:
        return []
    procs = _tree(leader)
    signal_all(procs, signal.SIGTERM)
    left = _wait_gone(procs, timeout, leader, alone_s)
    forced = [_describe(p) for p in left]
    signal_all(left, signal.SIGKILL)
    _wait_gone(left, 5)
    return forced


def stop_leftovers(rec: dict[str, Any], timeout: float = STOP_S) -> list[str]:
    """Stop what a dead service left in its process group (it was the group's
    leader: start() gives each service a session of its own), as `stop` would
    have. Only processes started after the service are signalled: a group id
    is the leader's pid, which the system may since have given to another.
    Returns what had to be SIGKILLed."""
    left = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == rec["pid"] and proc.create_time() >= rec["started"] - 0.01:
                left.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    signal_all(left, signal.SIGTERM)
    forced = _wait_gone(left, timeout)
    signal_all(forced, signal.SIGKILL)
    _wait_gone(forced, 5)
    return [_describe(p) for p in forced]


def _running(proc: psutil.Process) -> bool:
    """Not exited. A zombie has exited: it waits only for its parent (or,
    orphaned, init) to reap it, and psutil.wait_procs would wait out the
    whole timeout on one that is not our child."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float, leader: psutil.Process | None = None,
               alone_s: float | None = None) -> list[psutil.Process]:
    """Those of `procs` still running after `timeout` (returns as soon as none
    is), or, given `alone_s`, once `leader` has been the only one left that long."""
    now = time.monotonic()
    deadline, alone_since = now + timeout, None
    left = [p for p in procs if _running(p)]
    while left and now < deadline:
        if alone_s is not None and [p.pid for p in left] == [leader.pid]:
            alone_since = alone_since or now
            if now - alone_since >= alone_s:
                break
        time.sleep(0.1)
        now = time.monotonic()
        left = [p for p in left if _running(p)]
    return left


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {proc.status()} {' '.join(proc.cmdline())[:200]}"
    except psutil.NoSuchProcess:
        return f"{proc.pid} gone"


def http_ok(url: str, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except OSError:
        return False


def log_tail(rec: dict[str, Any], lines: int = 30) -> str:
    try:
        return "\n".join(Path(rec["log"]).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_http(rec: dict[str, Any], url: str, timeout: float) -> None:
    """Wait until `url` answers 2xx; raise ServiceError if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if http_ok(url):
            return
        if not alive(rec):
            raise ServiceError(f"{rec['name']} exited during start-up; {rec['log']}:\n{log_tail(rec)}")
        time.sleep(0.5)
    raise ServiceError(f"{rec['name']} did not answer {url} within {timeout:.0f} s; "
                       f"{rec['log']}:\n{log_tail(rec)}")
