"""Which checkpoints a run has: the COMPLETE marker that commits one (sizes
and sha256 of every file), finding the complete ones and the newest, and
removing the ones a run no longer keeps. What a checkpoint holds and how it
is written and read is gpt2.checkpoint.store; this module never loads torch
tensors, so finding a run's newest checkpoint stays cheap.
"""

from __future__ import annotations

import hashlib
import logging
import re

from gpt2.checkpoint import shares
from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.root import layout, storage

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "state.json")
"""The files of a checkpoint written by one process."""
REQUIRED = ("model.safetensors", "rng.pt", "state.json")
"""The files every checkpoint has, beside its optimizer file(s)."""
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is incomplete or damaged; the message names the file."""


def step_dirs(run_dir: str) -> list[tuple[int, str]]:
    """(step, url) of every step directory, newest first, complete or not."""
    base = layout.checkpoints_dir(run_dir)
    found = [(int(m.group(1)), storage.join(base, name))
             for name in storage.list_dir(base) if (m := _STEP_DIR.match(name))]
    return sorted(found, reverse=True)


def _well_formed(marker: object) -> bool:
    """A marker that names a step and every file with its size and sha256."""
    if not isinstance(marker, dict) or not isinstance(marker.get("step"), int):
        return False
    files = marker.get("files")
    return isinstance(files, dict) and _complete_set(files) and all(
        isinstance(f, dict) and isinstance(f.get("bytes"), int) and isinstance(f.get("sha256"), str)
        for f in files.values())


def _complete_set(names) -> bool:
    """The required files and a whole set of optimizer files, nothing else."""
    optimizer = shares.optimizer_files(names)
    return optimizer is not None and set(names) == set(REQUIRED) | set(optimizer)


def read_marker(url: str) -> dict | None:
    """The COMPLETE marker of a checkpoint directory; None if absent, torn or
    malformed (all three mean the checkpoint is incomplete)."""
    marker = storage.read_record(storage.join(url, MARKER))
    return marker if _well_formed(marker) else None


def complete_checkpoints(config_or_run_dir: Config | str) -> list[str]:
    """URLs of the checkpoints whose marker exists and whose file sizes match it, newest first."""
    run_dir = layout.run_dir(config_or_run_dir) if isinstance(config_or_run_dir, Config) else config_or_run_dir
    return [url for _, url in step_dirs(storage.normalize_url(run_dir)) if is_complete(url)]


def is_complete(url: str) -> bool:
    """A well-formed marker, and every file it lists at the size it records."""
    marker = read_marker(url)
    return marker is not None and all(storage.size(storage.join(url, n)) == f["bytes"]
                                      for n, f in marker["files"].items())


def latest_checkpoint(config_or_run_dir: Config | str) -> str | None:
    """URL of the newest complete checkpoint of a run (a Config or a run dir URL)."""
    found = complete_checkpoints(config_or_run_dir)
    return found[0] if found else None


def file_entry(data: bytes) -> dict:
    """What the marker records of a file."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_marker(url: str, step: int, files: dict[str, dict]) -> None:
    """Commit a checkpoint whose files (name -> file_entry) are all written."""
    if not _complete_set(files):
        raise CheckpointError(f"refusing to mark {url} complete: its files {sorted(files)} are not a whole checkpoint")
    storage.write_record(storage.join(url, MARKER), {"step": step, "files": files})


def discard_after(run_dir: str, step: int) -> None:
    for later, url in step_dirs(run_dir):
        if later > step:
            log.warning("deleting checkpoint %s (newer than the one resumed from)", url)
            storage.remove(storage.join(url, MARKER))
            storage.remove(url, recursive=True)


def prune(run_dir: str, keep: int, written_step: int | None = None) -> None:
    """Keep the newest `keep` complete checkpoints up to `written_step` (the
    one just written); delete older ones, incomplete leftovers and any step
    beyond `written_step` (left by an abandoned timeline of the run: they
    must never outrank the checkpoint just written). The marker goes first,
    so a half-deleted directory never looks complete."""
    dirs = step_dirs(run_dir)
    kept = [url for step, url in dirs if (written_step is None or step <= written_step) and is_complete(url)][:keep]
    for _, url in dirs:
        if url not in kept:
            storage.remove(storage.join(url, MARKER))
            storage.remove(url, recursive=True)
            log.debug("removed old checkpoint %s", url)


def clear_run(run_dir: str) -> None:
    """Delete every checkpoint of a run (`--fresh`)."""
    for _, url in step_dirs(run_dir):
        storage.remove(storage.join(url, MARKER))
    storage.remove(layout.checkpoints_dir(run_dir), recursive=True)
