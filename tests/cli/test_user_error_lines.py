"""A user error reaches the console as one line naming a log file that holds
its traceback; a bug keeps its traceback on the console (#46 item 2)."""

from __future__ import annotations

import io
import logging

import pytest

from cli.common import log_to_file
from gpt2.config.overrides import resolve_config
from gpt2.errors import UserError


@pytest.fixture
def console():
    root = logging.getLogger()
    saved = root.handlers[:]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root.handlers = [handler]
    yield stream
    for h in root.handlers:
        if h not in saved:
            h.close()
    root.handlers = saved


def _log_raised(error: Exception) -> None:
    try:
        raise error
    except Exception:
        logging.getLogger("prefect.flow_runs").error("Encountered exception during execution", exc_info=True)


def test_a_user_errors_traceback_goes_to_the_log_file_only(tmp_path, console):
    path = log_to_file(resolve_config("smoke", {"runtime.work_dir": str(tmp_path)}), verbose=False)
    _log_raised(UserError("no files match data.source 'x'"))
    _log_raised(KeyError("a bug"))
    shown = console.getvalue()
    first, *rest = shown.split("ERROR ")[1:]
    assert "Traceback" not in first and f"(traceback in {path})" in first
    assert "Traceback" in rest[0] and "KeyError: 'a bug'" in rest[0]  # a bug keeps its traceback
    kept = path.read_text()
    assert kept.count("Traceback") == 2 and "UserError: no files match data.source 'x'" in kept


def test_verbose_shows_the_users_traceback_on_the_console_too(tmp_path, console):
    log_to_file(resolve_config("smoke", {"runtime.work_dir": str(tmp_path)}), verbose=True)
    _log_raised(UserError("a second trainer holds this run"))
    assert "Traceback" in console.getvalue()


def test_prefects_crash_lines_for_the_users_ctrl_c_stay_off_the_console(tmp_path, console):
    """#64 item 4: a stop the user asked for showed three red `Crash detected!` lines."""
    from gpt2.process import signals

    path = log_to_file(resolve_config("smoke", {"runtime.work_dir": str(tmp_path)}), verbose=False)
    crash = "Crash detected! Execution was aborted by an interrupt signal."
    engine = logging.getLogger("prefect.flow_runs")
    engine.error(crash)  # no Ctrl-C was pressed: a crash of its own, shown
    assert console.getvalue().count(crash) == 1
    signals._requested.set()
    try:
        engine.error(crash)
        engine.error("Finished in state Crashed('Execution was aborted by an interrupt signal.')")
        engine.error("a real error after the Ctrl-C")
    finally:
        signals._requested.clear()
    shown = console.getvalue()
    assert shown.count(crash) == 1 and "Finished in state" not in shown and "a real error after the Ctrl-C" in shown
    assert path.read_text().count(crash) == 2  # the log file keeps every line


def test_the_pipeline_summary_is_printed_by_the_command_not_logged_on_the_console_too(tmp_path, console):
    """#64 item 5: the summary showed twice, as a log line on stderr and on stdout."""
    from flows.summary import SUMMARY_RECORD

    path = log_to_file(resolve_config("smoke", {"runtime.work_dir": str(tmp_path)}), verbose=False)
    engine = logging.getLogger("prefect.flow_runs")  # at WARNING: the level this test's loggers let through
    engine.warning("checkpoint: file:///x", extra={SUMMARY_RECORD: True})
    engine.warning("stage train done in 3.0 s")
    assert "checkpoint: file:///x" not in console.getvalue() and "stage train done" in console.getvalue()
    assert "checkpoint: file:///x" in path.read_text()
