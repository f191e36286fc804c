"""Helpers for tests that drive `gpt2 stack` and `prefect` as separate processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli.stack.prefect_setup import isolated_env


def clean_env(home: Path) -> dict[str, str]:
    """This machine's environment minus anything that points Prefect elsewhere."""
    return isolated_env(home)


def gpt2(env: dict[str, str], cwd: Path, *args: str, check: bool = True,
         python: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([python or sys.executable, "-m", "cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"gpt2 {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def last_json(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def prefect(env: dict[str, str], cwd: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "prefect", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
