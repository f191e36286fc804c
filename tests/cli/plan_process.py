"""`gpt2 plan` as its own process, for the tests that check the command itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def gpt2_plan(root: str | Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`gpt2 plan --root ROOT ARGS`, run as `python -m cli.main`: the console
    script's own entry point (cli.main:main), which the quick tier's warm
    interpreter starts without re-importing torch (tests/warm_python)."""
    return subprocess.run([sys.executable, "-m", "cli.main", "plan", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
