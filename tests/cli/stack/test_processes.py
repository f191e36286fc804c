"""cli/stack/processes.py with real processes: a detached service and the process it
starts in a session of its own both stop; a reused pid is never signalled."""

from __future__ import annotations

import sys
import textwrap
import time

import psutil
import pytest

from cli.stack import processes

# A "service" that starts a grandchild in its own session (as a worker's flow
# run may), prints its pid and serves HTTP.
SERVICE = textwrap.dedent("""
    import http.server, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print(child.pid, flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
""")


def test_start_wait_and_stop_the_whole_tree(tmp_path):
    port = processes.free_port()
    rec = processes.start("svc", [sys.executable, "-c", SERVICE, str(port)], {}, tmp_path, tmp_path / "logs")
    processes.wait_http(rec, f"http://127.0.0.1:{port}/", timeout=30)
    assert processes.alive(rec)
    grandchild = psutil.Process(int((tmp_path / "logs" / "svc.log").read_text().split()[0]))
    assert grandchild.is_running() and grandchild.pid != rec["pid"]

    processes.stop(rec, timeout=5)
    assert not processes.alive(rec) and not processes.http_ok(f"http://127.0.0.1:{port}/", timeout=1)
    assert not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE


def test_a_reused_pid_is_left_alone(tmp_path):
    me = psutil.Process()
    rec = {"name": "old", "pid": me.pid, "started": me.create_time() - 100, "log": str(tmp_path / "x.log")}
    assert not processes.alive(rec)
    processes.stop(rec)  # would kill this test if it signalled the pid
    assert me.is_running()


def test_start_up_failure_names_the_log(tmp_path):
    rec = processes.start("broken", [sys.executable, "-c", "import sys; print('no config'); sys.exit(3)"], {},
                          tmp_path, tmp_path / "logs")
    with pytest.raises(processes.ServiceError, match="no config"):
        processes.wait_http(rec, f"http://127.0.0.1:{processes.free_port()}/", timeout=30)


def test_a_service_that_exited_unreaped_counts_as_stopped(tmp_path):
    """A process that has exited but is not yet reaped (a zombie: an orphan
    waits for init) is stopped. `gpt2 stack down` runs in a process of its own
    (here too), and waiting for a zombie that is not its child to vanish
    waited out every worker's whole checkpoint window (135 s each)."""
    import json
    import os
    import subprocess

    rec = processes.start("svc", [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"],
                          {}, tmp_path, tmp_path / "logs")
    # Running before it is stopped: a SIGTERM at its very start would test nothing of interest.
    while "ready" not in (tmp_path / "logs" / "svc.log").read_text():
        assert processes.alive(rec)
        time.sleep(0.05)
    # The service is this test's child: once SIGTERM ends it, it stays a zombie until this process reaps it.
    stop = ("import json, sys; from cli.stack import processes; "
            "print(json.dumps(processes.stop(json.loads(sys.argv[1]), timeout=10)))")
    try:
        done = subprocess.run([sys.executable, "-c", stop, json.dumps(rec)], capture_output=True, text=True,
                              timeout=120, cwd=os.getcwd())
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == []  # it ended on SIGTERM: nothing was left to SIGKILL
        assert psutil.Process(rec["pid"]).status() == psutil.STATUS_ZOMBIE
        assert not processes.alive(rec)
    finally:
        with pytest.raises(ChildProcessError):
            while True:
                os.waitpid(rec["pid"], 0)
