"""The terminal progress bar (#64 item 5): it owns its line, so a log line written while it is drawn
starts on a line of its own, whole; and its ETA counts from the first training step."""

from __future__ import annotations

import io
import logging
import re
import sys
import time

from gpt2.process.console import ConsoleStream
from gpt2.train.progress import ProgressBar, StepInfo


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _step(step: int) -> StepInfo:
    return StepInfo(step=step, max_steps=10, loss=3.0, lr=1e-3, grad_norm=1.0, tokens_per_second=1000.0, mfu=None,
                    eta_seconds=None)


def test_a_log_line_lands_above_the_bar_whole(monkeypatch):
    terminal = Terminal()
    console = ConsoleStream(terminal)
    monkeypatch.setattr(sys, "stderr", console)
    handler = logging.StreamHandler(console)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("test.progress")
    log.addHandler(handler)
    try:
        bar = ProgressBar(10, disable=False)
        bar(_step(1))
        log.warning("checkpoint written")
        bar(_step(2))
        bar.close()
    finally:
        log.removeHandler(handler)
    out = terminal.getvalue()
    # The bar's line is cleared (\r, blanks, \r) before the log line, which starts the line intact...
    assert re.search(r"\r *\rWARNING checkpoint written\n", out), repr(out)
    # ...and the bar is drawn again after it.
    assert "2/10" in out.split("WARNING checkpoint written\n", 1)[1]
    assert console.bar is None  # closed: later writes go straight through
    console.write("after\n")
    assert terminal.getvalue().endswith("after\n")


def test_the_bar_starts_at_the_first_step(monkeypatch):
    monkeypatch.setattr(sys, "stderr", ConsoleStream(Terminal()))
    bar = ProgressBar(10, disable=False)
    assert bar.bar is None  # what comes before training (preflight, compile) is not in its rate
    time.sleep(0.2)
    made = time.time()
    bar(_step(4))  # a resumed run's first step here is its 4th
    assert bar.bar.start_t >= made and bar.bar.n == 4 and bar.bar.initial == 3
    bar.close()


def test_no_bar_off_a_terminal(monkeypatch):
    stream = io.StringIO()  # a pipe or a file: isatty() is False
    monkeypatch.setattr(sys, "stderr", ConsoleStream(stream))
    bar = ProgressBar(10)
    bar(_step(1))
    bar.close()
    assert stream.getvalue() == "" and sys.stderr.bar is None
