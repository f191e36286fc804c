"""The CLI's temporary Prefect server: a generous start-up wait by default,
the user's setting kept, and a failure to start that names the setting to
raise (a real `gpt2 prepare` process, no server running)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cli.common import SERVER_WAIT_S, SERVER_WAIT_SETTING, prefect_env

REPO = Path(__file__).resolve().parents[2]


def test_default_wait_is_generous_and_a_users_setting_wins(monkeypatch):
    monkeypatch.delenv(SERVER_WAIT_SETTING, raising=False)
    prefect_env()
    assert int(os.environ[SERVER_WAIT_SETTING]) == SERVER_WAIT_S > 20  # Prefect's own default is 20 s
    monkeypatch.setenv(SERVER_WAIT_SETTING, "7")
    prefect_env()
    assert os.environ[SERVER_WAIT_SETTING] == "7"


def test_a_server_that_does_not_answer_in_time_names_the_setting_to_raise(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    # No time at all to answer: the same error a busy machine gets after the full wait.
    env.update({SERVER_WAIT_SETTING: "0", "PREFECT_HOME": str(tmp_path / "prefect-home"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    out = subprocess.run([sys.executable, "-m", "cli.main", "prepare", "--preset", "smoke",
                          "--root", str(tmp_path / "root"), "--set", f"runtime.work_dir={tmp_path / 'work'}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "temporary API server did not answer within 0 s" in out.stderr
    assert f"raise {SERVER_WAIT_SETTING}" in out.stderr
    assert "Traceback" not in out.stderr
    # Nothing was started: the root holds no data stage output.
    assert not (tmp_path / "root" / "data").exists()
