"""`gpt2 sweep` refuses a sweep it cannot run before any server starts: no members, a malformed
grid, a member with an unknown key or a value out of range (named by number and key, all at once)."""

from __future__ import annotations

import subprocess
import sys

from tests.cli.read_only_mount import gpt2_read_only, needs_mount


def _sweep(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "sweep", "--root", str(tmp_path / "root"), *args],
                          capture_output=True, text=True, timeout=120)


def test_bad_members_are_refused_by_number_and_key_before_anything_starts(tmp_path):
    done = _sweep(tmp_path, "--grid", "train.lr=1e-3,-1", "--grid", "train.max_stepz=4")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("error: member 1 (train.lr=0.001 train.max_stepz=4): unknown key 'train.max_stepz'")
    assert lines[1].startswith("member 2 (train.lr=-1 train.max_stepz=4): ") and "train.lr:" in lines[1]
    assert "nothing was started" in lines[-1]
    assert not (tmp_path / "root").exists() and "Prefect" not in done.stderr


def test_a_sweep_without_members_or_with_a_malformed_grid_says_how(tmp_path):
    none = _sweep(tmp_path)
    assert none.returncode == 2 and "give --grid key=v1,v2" in none.stderr
    bad = _sweep(tmp_path, "--grid", "train.lr")
    assert bad.returncode == 2 and "--grid 'train.lr' is not of the form key=v1,v2" in bad.stderr



@needs_mount
def test_a_root_that_cannot_be_written_is_named_before_anything_starts(tmp_path, fresh_python):
    root = tmp_path / "root"
    root.mkdir()
    done = gpt2_read_only(root, "sweep", "--root", str(root), "--grid", "train.lr=1e-3,3e-3")
    assert done.returncode == 1, done.stderr
    assert f"artifact root file://{root} is not writable" in done.stderr
    assert "pass a writable --root" in done.stderr and "Traceback" not in done.stderr
