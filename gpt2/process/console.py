"""Console output that can die without taking the run with it.

A terminal's Ctrl-C reaches every process of its foreground group: under
`gpt2 run ... 2>&1 | tee run.log` (the habit llm.c's and nanoGPT's scripts
teach) it ends `tee` too, and the next write to the pipe fails (EPIPE; a
hung-up terminal or a closed ssh session gives EIO). Python raises
BrokenPipeError there, and rich, which draws Prefect's console log, turns it
into SystemExit(1): either one ended a run in the middle of its Ctrl-C
checkpoint. `survive_closed_console()` wraps stdout and stderr so that a write
that finds the console gone marks it gone: from then on the stream (and its
file descriptor, pointed at /dev/null, so that C code and rich's own checks
find a working file) takes every write and drops it. The log file keeps
everything; what the run must do never waits on the console.

A progress bar drawn on the console (gpt2.train.progress) owns its line: it
draws through `bar_channel()`, and every other write first clears the bar and,
once its line is complete, draws it again below, so a log line never lands on
the bar's line (where it lost its first character to the bar's `\r`).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, Callable, TextIO

GONE = (errno.EPIPE, errno.EIO)
"""A write error that means the reader is gone (a closed pipe, a hung-up terminal), not a bug."""


class ConsoleStream:
    """A text stream that outlives its reader: see the module docstring."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.gone = False
        self.bar: Any = None
        """A progress bar drawn on this stream (tqdm: clear() and refresh()), while one is."""

    def write(self, text: str) -> int:
        bar = self.bar
        if bar is None or self.gone:
            return self._write(text)
        bar.clear()
        written = self._write(text)
        if text.endswith("\n"):
            bar.refresh()
        return written

    def bar_channel(self) -> "BarChannel":
        """Where a progress bar on this stream draws: the same stream, past the bar's own clearing."""
        return BarChannel(self)

    def _write(self, text: str) -> int:
        written = self._unless_gone(lambda: self._stream.write(text))
        return len(text) if written is None else written

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._unless_gone(self._stream.flush)

    def _unless_gone(self, act: Callable[[], Any]) -> Any:
        """`act()`, unless the console is gone; a write error that means it went (GONE) marks it so
        (and returns None), any other still raises."""
        if self.gone:
            return None
        try:
            return act()
        except OSError as err:
            if err.errno not in GONE:
                raise
            self._lose()
            return None

    def _lose(self) -> None:
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)
            self._stream.flush()  # what the failed write left in the buffer goes to /dev/null
        except (OSError, ValueError, AttributeError):
            pass  # no descriptor of its own (a test's StringIO) or already closed: the flag is enough

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty, buffer, ...
        return getattr(self._stream, name)


class BarChannel:
    """A progress bar's way onto a ConsoleStream: its writes survive the reader going away too."""

    def __init__(self, console: ConsoleStream):
        self._console = console

    def write(self, text: str) -> int:
        return self._console._write(text)

    def flush(self) -> None:
        self._console.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: the console's
        return getattr(self._console, name)


def survive_closed_console() -> None:
    """Wrap sys.stdout and sys.stderr (once). Call it before anything keeps a reference to
    them: Prefect's console handler resolves `ext://sys.stderr` when it is configured."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ConsoleStream):
            setattr(sys, name, ConsoleStream(stream))
