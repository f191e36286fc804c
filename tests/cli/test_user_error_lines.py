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
