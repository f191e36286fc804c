"""`python -m gpt2.preflight` as processes: a rank that never joins is named
(and what needs no other rank still runs), two gloo ranks pass together, and
a SIGTERM ends the preflight promptly without leaving its probe behind."""

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

from gpt2.root import layout
from tests.gpt2.train.fixtures import TINY, tiny_config, write_dataset
from tests.tiers import SCENARIO

pytestmark = SCENARIO

REPO = Path(__file__).resolve().parents[3]
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "TORCHELASTIC_USE_AGENT_STORE", "GROUP_RANK", "ROLE_RANK")
PROCESS_TIMEOUT_S = 240
"""A cold interpreter's imports, the checks and one timed step, on a loaded 2-core machine."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(root: Path, *extra: str) -> list[str]:
    """`python -m gpt2.preflight` on the tiny config at `root` (work dir under it)."""
    cmd = [sys.executable, "-m", "gpt2.preflight", "--root", str(root), *extra]
    for key, value in {**TINY, "runtime.work_dir": str(root / "work")}.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def _env(**dist: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    return {**env, "PYTHONUNBUFFERED": "1", **dist}


def _rank_env(rank: int, port: int) -> dict[str, str]:
    """What torchrun would give rank `rank` of two on this machine."""
    return _env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def _start(cmd: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    # A session of its own, so a hung preflight is ended with everything it started.
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, text=True, **kw)


def _finish(proc: subprocess.Popen, timeout: float = PROCESS_TIMEOUT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr); a process still running at `timeout` is killed and fails the test."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the preflight still ran after {timeout:.0f} s:\n{out}\n{err}") from None
    return proc.returncode, out, err


def _ready(tmp_path: Path):
    root = tmp_path / "root"
    config = tiny_config(root)
    write_dataset(config)
    return root, config


# --- 10. ranks -----------------------------------------------------------------


def test_a_rank_that_never_joins_is_named_and_the_local_checks_still_run(tmp_path):
    root, config = _ready(tmp_path)
    proc = _start(_command(root, "--json", "--steps", "1", "--join-timeout", "5"), _rank_env(0, _free_port()),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = time.monotonic()
    code, out, err = _finish(proc)
    assert code == 1, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["failed"] == ["collectives"], err
    assert result["checks"]["collectives"]["status"] == "fail"
    assert result["missing_ranks"] == [1]
    detail = result["checks"]["collectives"]["detail"]
    assert detail.startswith("rank(s) 1 of 2 did not join within 5 s"), detail
    # What needs no other rank ran on rank 0 and passed; what needs them all is skipped, saying so.
    for name in ("devices", "data", "root", "disk", "lease"):
        assert result["checks"][name]["status"] == "ok", (name, result["checks"][name])
    for name in ("memory", "compile", "throughput"):
        assert result["checks"][name]["status"] == "skipped"
        assert "needs every rank" in result["checks"][name]["detail"]
    assert "world size 2" in result["checks"]["devices"]["detail"]
    assert time.monotonic() - started < PROCESS_TIMEOUT_S  # it did not wait for torch's own timeout
    assert not (root / "runs").exists()  # the probe was removed


def test_two_gloo_ranks_pass_together_with_a_bus_bandwidth(tmp_path):
    root, config = _ready(tmp_path)
    port = _free_port()
    cmd = _command(root, "--json", "--steps", "1", "--join-timeout", "120")
    procs = [_start(cmd, _rank_env(rank, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in (0, 1)]
    try:
        (code0, out0, err0), (code1, out1, err1) = [_finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert code0 == 0, err0
    assert code1 == 0, err1
    assert out1.strip() == ""  # rank 0 reports for every rank
    result = json.loads(out0.strip().splitlines()[-1])
    assert result["ok"] is True and result["failed"] == []
    collectives = result["checks"]["collectives"]
    assert collectives["status"] == "ok"
    assert "gloo all-reduce" in collectives["detail"] and "over 2 ranks" in collectives["detail"]
    assert "bus bandwidth" in collectives["detail"] and result["all_reduce_bus_bytes_per_s"] > 0
    assert result["backend"] == "gloo"
    assert result["checks"]["memory"]["status"] == "ok"
    assert "DDP over 2 ranks" in result["checks"]["memory"]["detail"]
    assert result["micro_batch"] == 4 and result["accumulation"] == 1  # 8 sequences a step over 2 ranks
    assert not (root / "runs").exists()


# --- 11. SIGTERM ---------------------------------------------------------------


class _Lines:
    """The lines a process writes to stdout, read as they come."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def check_line(self, name: str) -> str | None:
        """The line of check `name`, once it was shown."""
        return next((line for line in list(self.lines) if line.split()[1:2] == [name]), None)

    def join(self) -> None:
        self._thread.join(timeout=30)


def _wait_for(condition, proc: subprocess.Popen, timeout: float = PROCESS_TIMEOUT_S, poll_s: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the preflight ended (code {proc.returncode}) before the signal"
        assert time.monotonic() < deadline, "the preflight never reached the point of the signal"
        time.sleep(poll_s)


@pytest.mark.parametrize("when", ["in the root check", "in the steps"])
def test_sigterm_ends_the_preflight_promptly_leaving_nothing_under_the_run_dir(tmp_path, when):
    root, config = _ready(tmp_path)
    run_dir = Path(layout.run_dir(config)[len("file://"):])
    # Steps enough to run for minutes: only the signal ends it.
    proc = _start(_command(root, "--steps", "100000"), _env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines = _Lines(proc)
    try:
        if when == "in the root check":
            # The run dir exists only while the root check's probe is in it: the
            # signal lands while the probe's temporary file is being written.
            _wait_for(run_dir.exists, proc)
        else:
            # collectives is shown (skipped: one rank) just before the steps start.
            _wait_for(lambda: lines.check_line("collectives") is not None, proc, poll_s=0.05)
            time.sleep(1.0)  # into the timed steps
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = proc.wait(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines.join()
    assert code == 128 + signal.SIGTERM, "\n".join(lines.lines)
    assert took < 30
    if when == "in the steps":
        assert lines.check_line("memory") is None  # interrupted mid-steps, not after them
    # No probe object, no directory the probe created: the run dir and runs/ are gone again.
    assert not run_dir.exists(), sorted(map(str, run_dir.rglob("*")))
    assert not (root / "runs").exists()
    assert not any(p.name.startswith(".preflight-probe-") for p in root.rglob("*"))
