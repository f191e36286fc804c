"""Prefect's temporary server keeps its run history in the work dir, not in
`~/.prefect` (cli.common.temporary_server_database; README, "What lives
where"), unless the user configured a server or a database of their own.
The real command on a temporary server: tests/cli/test_stages.py (end to end)."""

from __future__ import annotations

import os

from prefect.settings import PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

from cli.common import temporary_server_database
from gpt2.config.overrides import resolve_config

SETTING = "PREFECT_SERVER_DATABASE_CONNECTION_URL"


def test_the_temporary_servers_database_is_the_work_dirs_and_a_users_own_is_left_alone(tmp_path, monkeypatch):
    config = resolve_config("smoke", {"runtime.work_dir": str(tmp_path / "work")}, root=str(tmp_path / "root"))
    monkeypatch.delenv(SETTING, raising=False)  # restored after the test, whatever the function set
    # Defaults restored: a worker that started the session's test server (prefect_server) has its own set.
    with temporary_settings(restore_defaults={PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL},
                            updates={PREFECT_HOME: str(tmp_path / "home")}):
        temporary_server_database(config)
    assert os.environ.pop(SETTING) == f"sqlite+aiosqlite:///{tmp_path / 'work' / 'prefect.db'}"
    assert (tmp_path / "work" / "prefect.db").stat().st_size > 0  # a migrated copy, not an empty file
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        temporary_server_database(config)  # a server of the user's
    mine = f"sqlite+aiosqlite:///{tmp_path / 'mine.db'}"
    with temporary_settings(restore_defaults={PREFECT_API_URL}, updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: mine}):
        temporary_server_database(config)  # a database of the user's
    assert SETTING not in os.environ


def test_the_temporary_server_starts_without_registering_block_types_unless_the_user_said(monkeypatch):
    """cli.common.TEMPORARY_SERVER_QUICK_START, read through Prefect's own settings: its server then
    skips the import of every installed collection at start. A value the user set is kept; with a
    server of the user's, nothing is set."""
    from prefect.settings import Settings

    from cli.common import TEMPORARY_SERVER_QUICK_START, temporary_server_quick_start

    for name in TEMPORARY_SERVER_QUICK_START:
        monkeypatch.setenv(name, "")  # so that monkeypatch restores it, whatever the function sets
        monkeypatch.delenv(name)
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        temporary_server_quick_start()  # a server of the user's
    assert not set(TEMPORARY_SERVER_QUICK_START) & set(os.environ)
    before = Settings().server
    assert before.register_blocks_on_start and before.memoize_block_auto_registration  # Prefect's defaults
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        temporary_server_quick_start()
    after = Settings().server
    assert not after.register_blocks_on_start and not after.memoize_block_auto_registration
    monkeypatch.setenv("PREFECT_API_BLOCKS_REGISTER_ON_START", "true")  # the user's
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        temporary_server_quick_start()
    assert Settings().server.register_blocks_on_start
