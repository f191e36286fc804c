"""gpt2.tracking.outbox.Outbox: a sender whose attempt outlives stop() says nothing afterwards."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from gpt2.tracking.outbox import Outbox


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def logged():
    """What gpt2.tracking.outbox logs during the test (whatever pytest's own capture does)."""
    handler = _Records()
    logger = logging.getLogger("gpt2.tracking.outbox")
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


def test_running_lists_an_outbox_until_it_is_stopped():
    from gpt2.tracking import outbox

    box = Outbox("dest", lambda: None, lambda conn, batch: None, interval_s=0.05)
    assert box in outbox.running()
    box.stop()
    assert box not in outbox.running()


LEFT_OPEN = '''
import logging, sys
from gpt2.tracking.outbox import Outbox

# As MLflow's handler: made at import, writing to the stream pytest captures then.
logging.getLogger("late").addHandler(logging.StreamHandler(sys.stderr))

def test_leaves_a_sender_retrying():
    def connect():
        logging.getLogger("late").warning("retrying a stopped server")
        raise ConnectionError("down")
    Outbox("dest", connect, lambda conn, batch: None, interval_s=0.01)
'''


@pytest.mark.parametrize("stopped", [True, False])
def test_a_sender_left_open_by_a_test_stops_with_it(pytester, monkeypatch, stopped):
    """The quick tier's fixture (tests/conftest.py) stops what a test left
    sending; without it the sender logs after pytest closed its stream."""
    # The process lingers after pytest closed its streams, as an xdist worker does.
    conftest = "import atexit, time\n\natexit.register(time.sleep, 2.5)\n"
    if stopped:
        conftest = "from tests.conftest import outboxes_stop_with_their_test  # noqa: F401\n" + conftest
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_left_open=LEFT_OPEN)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[3]))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert ("Logging error" in result.stderr.str()) is not stopped
