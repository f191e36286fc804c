"""A command run with its artifact root read-only, the way the world makes
one: a read-only bind mount of the same directory (EROFS), in a mount
namespace of the command's own. A chmod would not do: the tests may run as
root, who writes anyway.

The command's process makes the namespace itself (unshare(2), mount(2)) and
then runs `cli.main` as `python -m` would, so under the quick tier's warm
interpreter it is forked with torch and MLflow imported (tests/warm_python):
the mount is made in that process, after the fork, so it is inside."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# argv: the directory to make read-only, then the module's arguments.
IN_READ_ONLY_ROOT = """
import ctypes, os, runpy, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
def check(ok, what):
    if ok != 0:
        err = ctypes.get_errno()
        sys.exit(f"read-only mount: {what}: {os.strerror(err)}")
root = sys.argv[1].encode()
check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")  # a mount namespace of this process's own
check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")  # nothing leaks out
check(libc.mount(root, root, None, MS_BIND, None), "bind")
check(libc.mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), "remount read-only")
if len(sys.argv) > 2:
    sys.argv = [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
NO_SERVER = "http://127.0.0.1:9/api"  # nothing listens: a command that asked Prefect anything would fail


def can_mount_read_only() -> bool:
    """Root in a mount namespace of its own (no module: the mount alone, no imports)."""
    done = subprocess.run([sys.executable, "-c", IN_READ_ONLY_ROOT, "/tmp"], capture_output=True)
    return done.returncode == 0


needs_mount = pytest.mark.skipif(not can_mount_read_only(),
                                 reason="needs unshare(2) and mount(2) (root in a mount namespace)")


def sets(overrides: dict) -> list[str]:
    """`--set key=value` for each override."""
    return [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]


def gpt2_read_only(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`gpt2 <args>` with `root` mounted read-only at its own path (`sys.executable`: the warm
    interpreter's proxy in the quick tier)."""
    env = {**os.environ, "PREFECT_API_URL": NO_SERVER, "WARM_PYTHON_C": "1"}  # `-c` warm too
    cmd = [sys.executable, "-c", IN_READ_ONLY_ROOT, str(root), "cli.main", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and mtime: equal before and after means nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}
