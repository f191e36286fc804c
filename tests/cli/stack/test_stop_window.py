"""`gpt2 stack down` gives a worker's flow runs the trainer's SIGTERM window:
a process that needs longer than a server's stop time to write its
checkpoint after SIGTERM still finishes it before anything is killed; a
worker left alone is not waited for past a server's window."""

from __future__ import annotations

import sys
import textwrap
import time

from cli.stack import processes, services
from gpt2.process.kill_window import STOP_GRACE_S

# A "worker" whose flow run (its child), told to stop, takes longer than a
# server is given to write its checkpoint; the worker itself, like Prefect's,
# does not end on SIGTERM.
FLOW_RUN = textwrap.dedent("""
    import pathlib, signal, sys, time
    def stop(signum, frame):
        time.sleep(float(sys.argv[2]))
        pathlib.Path(sys.argv[1]).write_text("checkpoint")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while True:
        time.sleep(1)
""")
WORKER = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
    while True:
        time.sleep(1)
""")


def test_down_waits_out_the_trainers_window_for_workers_only(tmp_path, monkeypatch):
    assert services.stop_timeout("worker-gpu") >= STOP_GRACE_S > processes.STOP_S
    assert services.stop_timeout("server") == processes.STOP_S
    # A server's window of 2 s (the code reads it at each stop): the test takes seconds, not a minute.
    monkeypatch.setattr(processes, "STOP_S", 2.0)
    marker = tmp_path / "checkpoint"
    save_s = processes.STOP_S + 1
    rec = processes.start("worker-gpu", [sys.executable, "-c", WORKER, FLOW_RUN, str(marker), str(save_s)], {},
                          tmp_path, tmp_path / "logs")
    while "ready" not in (tmp_path / "logs" / "worker-gpu.log").read_text():
        assert processes.alive(rec)
        time.sleep(0.1)
    started = time.monotonic()
    killed = services.stop_service(rec)
    # The flow run finished its checkpoint past a server's window: it was not killed.
    assert marker.read_text() == "checkpoint" and not processes.alive(rec)
    # The worker, alone once its flow run had ended, was killed after a server's window, not the trainer's.
    assert len(killed) == 1 and str(rec["pid"]) == killed[0].split()[0], killed
    assert time.monotonic() - started < services.stop_timeout("worker-gpu") / 2
