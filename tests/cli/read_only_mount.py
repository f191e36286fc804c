"""A command run with its artifact root read-only, the way the world makes
one: a read-only bind mount of the same directory (EROFS), in a mount
namespace of the command's own. A chmod would not do: the tests may run as
root, who writes anyway."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.warm_python import real_python

MOUNT = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
NO_SERVER = "http://127.0.0.1:9/api"  # nothing listens: a command that asked Prefect anything would fail


def can_mount_read_only() -> bool:
    if not shutil.which("unshare"):
        return False
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", MOUNT, "/tmp", "true"],
                          capture_output=True)
    return done.returncode == 0


needs_mount = pytest.mark.skipif(not can_mount_read_only(),
                                 reason="needs `unshare -m` and mount (root in a mount namespace)")


def sets(overrides: dict) -> list[str]:
    """`--set key=value` for each override."""
    return [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]


def gpt2_read_only(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`gpt2 <args>` with `root` mounted read-only at its own path, in the real interpreter (the
    warm one's children live outside the namespace), while the test's own runs stay warm."""
    env = {**os.environ, "PREFECT_API_URL": NO_SERVER}
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", MOUNT, str(root),
           real_python(), "-m", "cli.main", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and mtime: equal before and after means nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}
