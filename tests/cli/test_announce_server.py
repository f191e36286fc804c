"""A command whose flows go to a running Prefect server says so first, and why (#46 item 7)."""

from __future__ import annotations

from prefect.context import use_profile
from prefect.settings import PREFECT_API_URL
from prefect.settings.profiles import Profile

from cli.common import announce_server


def test_the_stacks_profile_is_named_with_how_to_leave_it(monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with use_profile(Profile(name="gpt2-local", settings={PREFECT_API_URL: "http://127.0.0.1:4321/api"})):
        line = announce_server()
    assert line == capsys.readouterr().err.strip()
    assert line.startswith("using the Prefect server at http://127.0.0.1:4321/api: the Prefect profile 'gpt2-local'")
    assert "gpt2 stack down" in line


def test_the_environment_is_named_when_it_sets_the_server(monkeypatch, capsys):
    monkeypatch.setenv("PREFECT_API_URL", "http://user:secret@example.invalid/api")
    with use_profile(Profile(name="mine", settings={PREFECT_API_URL: "http://user:secret@example.invalid/api"})):
        line = announce_server()
    assert "$PREFECT_API_URL is set" in line and "secret" not in line  # a password never reaches the screen


def test_a_temporary_server_is_not_announced(monkeypatch, capsys):
    from prefect.settings import temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    # Restored: a worker that started the session's test server (prefect_server) has its URL set.
    with use_profile(Profile(name="ephemeral", settings={})), temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert announce_server() is None
    assert capsys.readouterr().err == ""
