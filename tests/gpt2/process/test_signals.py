"""A Ctrl-C is recorded as it is raised, so one that Prefect's engine swallows
(it arrived just after a flow's code had finished) still stops the pipeline
before its next stage (gpt2.process.signals, flows.pipeline._run_stage)."""

from __future__ import annotations

import os
import signal

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
