"""A console that goes away (`| tee` ended by the same Ctrl-C, a hung-up terminal) does not end
the process writing to it (gpt2.process.console); a real error of the stream still raises."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2.process.console import ConsoleStream

REPO = Path(__file__).resolve().parents[3]

WRITER = """
import logging, sys, time
from gpt2.process.console import survive_closed_console
if sys.argv[2] == "wrapped":
    survive_closed_console()
from rich.console import Console

logging.basicConfig(stream=sys.stderr, level=logging.INFO)
console = Console(file=sys.stderr)
print("ready", flush=True)
time.sleep(1.0)  # the reader goes away meanwhile
for i in range(200):  # a pipe's buffer fills, then every write meets the dead reader
    print("x" * 1000, flush=True)
    logging.getLogger("run").info("step %d", i)
    console.print("a line drawn by rich, as Prefect's console handler draws its own")
open(sys.argv[1], "w").write("finished")
"""


@pytest.mark.parametrize("wrapped", [True, False])
def test_a_writer_outlives_a_reader_that_went_away(tmp_path, wrapped):
    """The `False` case shows the question is real: unwrapped, the same process dies at a write."""
    done = tmp_path / "done"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(done), "wrapped" if wrapped else "bare"], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout.readline() == b"ready\n"
    proc.stdout.close()  # as tee does on Ctrl-C
    code = proc.wait(timeout=60)
    if wrapped:
        assert code == 0 and done.read_text() == "finished"
    else:
        assert code != 0 and not done.exists()


def test_a_hung_up_terminal_is_gone_and_another_error_still_raises():
    class Failing(io.StringIO):
        error = errno.EIO

        def write(self, text):
            raise OSError(self.error, os.strerror(self.error))

    stream = ConsoleStream(Failing())
    assert stream.write("lost") == 4 and stream.gone
    assert stream.write("dropped") == 7  # not tried again
    full = Failing()
    full.error = errno.ENOSPC  # stdout redirected to a file on a full disk: an error to see, not a gone console
    with pytest.raises(OSError, match="No space"):
        ConsoleStream(full).write("x")
