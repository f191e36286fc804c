"""gpt2.outbox.Outbox: a sender whose attempt outlives stop() says nothing afterwards."""

from __future__ import annotations

import logging
import threading

import pytest

from gpt2.outbox import Outbox


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def logged():
    """What gpt2.outbox logs during the test (whatever pytest's own capture does)."""
    handler = _Records()
    logger = logging.getLogger("gpt2.outbox")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def test_an_attempt_that_outlives_stop_logs_nothing_after_it(monkeypatch, logged):
    """As when MLflow's own HTTP retries hold the sender past stop()'s join:
    the attempt fails after its owner has reported and gone (in a test, after
    pytest closed the streams its handlers write to)."""
    entered, release = threading.Event(), threading.Event()

    def connect():
        entered.set()
        release.wait(10)
        raise ConnectionError("refused")

    monkeypatch.setattr(threading.Thread, "join", lambda self, timeout=None: None)  # stop() gives up at once
    box = Outbox("dest", connect, lambda conn, batch: None, interval_s=0.05)
    box.put("record", lambda conn: None)
    assert entered.wait(5)
    box.stop()
    monkeypatch.undo()
    release.set()
    box._thread.join(5)
    assert not box._thread.is_alive()  # the sender ended with that attempt
    assert logged == []
    assert box.pending() == (0, 1)  # what was not sent is still counted for the owner


def test_an_outage_before_stop_is_still_warned_once(logged):
    calls = []

    def connect():
        calls.append(1)
        raise ConnectionError("refused")

    box = Outbox("dest", connect, lambda conn, batch: None, interval_s=0.05)
    box.put("record", lambda conn: None)
    assert not box.flush(timeout=5, give_up_on_outage=True)
    box.stop()
    assert [m for m in logged if "dest unavailable" in m] == [
        "dest unavailable (ConnectionError: refused); continuing, records are kept and retried"]
