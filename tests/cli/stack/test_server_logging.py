"""The stack server's logging setup is Prefect's own, as Prefect loads it,
with the automations' triggers and actions at INFO and nothing else changed."""

from __future__ import annotations

from pathlib import Path

from cli.stack import server_logging


def test_the_setup_is_prefects_own_plus_the_automations_at_info(tmp_path):
    import prefect
    from prefect.logging.configuration import load_logging_config

    path = server_logging.write(tmp_path)
    assert path == tmp_path / server_logging.FILE and not list(tmp_path.glob("*.tmp"))
    ours = load_logging_config(path)
    theirs = load_logging_config(Path(prefect.__file__).parent / "logging" / "logging.yml")
    for name in server_logging.LOGGERS:
        assert ours["loggers"].pop(name) == {"level": "INFO"}
    assert ours == theirs
    # It propagates to the handlers the server's own log lines go through.
    assert theirs["root"]["handlers"] and "propagate" not in theirs["loggers"].get("prefect.server", {})


def test_the_server_is_started_with_it(tmp_path):
    from cli.stack import services

    env = services._server_env({"HOME": str(tmp_path)}, tmp_path, 4200, "user:secret")
    assert env["PREFECT_LOGGING_SETTINGS_PATH"] == str(tmp_path / server_logging.FILE)
    assert (tmp_path / server_logging.FILE).exists()
