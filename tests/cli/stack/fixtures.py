"""Helpers for tests that drive `gpt2 stack` and `prefect` as separate processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def clean_env(home: Path) -> dict[str, str]:
    """This machine's environment minus anything that points Prefect elsewhere."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k not in ("GPT2_STACK_DIR", "MLFLOW_TRACKING_URI")}
    # One intra-op thread per trainer: the stack's processes share two cores, and
    # two OpenMP threads per trainer spin against each other and everything else
    # (a smoke step ran 20x slower that way). A user's own setting is kept.
    # The cache stays this user's: a fresh HOME per stack would otherwise make
    # the migrated empty databases new stacks copy (gpt2.seeded_store) again each
    # time, as a real user's machine does only once.
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": cache, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def gpt2(env: dict[str, str], cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)
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
