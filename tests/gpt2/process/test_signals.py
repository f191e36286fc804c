"""A Ctrl-C is recorded as it is raised, so one that Prefect's engine swallows
(it arrived just after a flow's code had finished) still stops the pipeline
before its next stage (gpt2.process.signals, flows.pipeline._run_stage)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2.process import signals


@pytest.fixture
def watched():
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signals.watch()
    yield
    signal.signal(signal.SIGINT, previous)
    signals._requested.clear()
    signals._stopped.clear()


def test_a_swallowed_ctrl_c_stops_at_the_next_stage(watched):
    signals.stop_if_requested()  # nothing asked yet: goes on
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        pass  # what Prefect's engine does with one that arrives after a flow's code has finished
    assert signals.requested()
    with pytest.raises(KeyboardInterrupt):
        signals.stop_if_requested()


def test_an_ignored_ctrl_c_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        signals.watch()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


FINALIZER = """
import gc, os, signal, sys, time
from gpt2.process import signals

signals.watch()

class Transport:
    def __del__(self):  # as asyncio's transports and SQLAlchemy's registries: the Ctrl-C lands in here
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
            pass

try:
    Transport()
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pass
    print("carried on")
except KeyboardInterrupt:
    print("stopped")
"""


def test_a_ctrl_c_that_lands_in_a_finalizer_stops_the_program_and_prints_no_traceback():
    """Found by tests/cli/test_ctrl_c.py: a Ctrl-C during the evaluate stage landed in asyncio's
    `_SelectorTransport.__del__`; Python printed "Exception ignored ... KeyboardInterrupt" with a
    traceback and the stage carried on to its end."""
    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", FINALIZER], cwd=repo, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(repo)},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.stdout.strip() == "stopped", (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


ACTED = """
import gc, os, signal, sys, time
from gpt2.process import signals

signals.watch()

class Transport:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
            pass

Transport()
gc.collect()
try:
    signals.stop_if_requested()  # the pipeline's runner acts on the swallowed Ctrl-C first
except KeyboardInterrupt:
    print("stopped", flush=True)
time.sleep(0.5)  # the way out (the command's last line, its exit code)
print("exited cleanly", flush=True)
"""


def test_a_ctrl_c_already_acted_on_is_not_delivered_again_on_the_way_out():
    """Found by tests/cli/test_ctrl_c.py: the Ctrl-C delivered again after the command had stopped
    for it ended the process by SIGINT (exit -2) instead of its exit code 130."""
    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", ACTED], cwd=repo, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(repo)},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.returncode == 0 and out.stdout.split() == ["stopped", "exited", "cleanly"], (out.stdout, out.stderr)
