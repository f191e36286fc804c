"""Fixtures of the flow tests."""

from __future__ import annotations

import pytest

from tests.cli.stack.fixtures import clean_env, gpt2, last_json


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("stack")
    env = clean_env(base / "home")
    info = last_json(gpt2(env, base, "stack", "up", "--root", str(base / "root"), "--json"))
    assert info["healthy"], info
    yield {**info, "env": env, "base": base}
    down = gpt2(env, base, "stack", "down", "--json", check=False)
    print(f"stack down: {down.stdout.strip()[-2000:]}")  # seconds per process, and what had to be killed
