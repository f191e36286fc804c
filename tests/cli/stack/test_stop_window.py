"""`gpt2 stack down` gives a worker's flow runs the trainer's SIGTERM window:
a process that needs longer than a server's stop time to write its
checkpoint after SIGTERM still finishes it before anything is killed."""

from __future__ import annotations

import sys
import textwrap
import time

from cli.stack import processes, services
from gpt2.kill_window import STOP_GRACE_S

# A "worker" whose flow run, told to stop, takes longer than a server is given to write its checkpoint.
WORKER = textwrap.dedent("""
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


def test_down_waits_out_the_trainers_window_for_workers_only(tmp_path):
    assert services.stop_timeout("worker-gpu") >= STOP_GRACE_S > processes.STOP_S
    assert services.stop_timeout("server") == processes.STOP_S
    marker = tmp_path / "checkpoint"
    save_s = processes.STOP_S + 1
    rec = processes.start("worker-gpu", [sys.executable, "-c", WORKER, str(marker), str(save_s)], {}, tmp_path,
                          tmp_path / "logs")
    while "ready" not in (tmp_path / "logs" / "worker-gpu.log").read_text():
        assert processes.alive(rec)
        time.sleep(0.1)
    processes.stop(rec, services.stop_timeout(rec["name"]))
    assert marker.read_text() == "checkpoint" and not processes.alive(rec)
