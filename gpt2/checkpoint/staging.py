"""Checkpoints staged on local disk before they go to the root.

A save writes the checkpoint under the work dir first (fsynced; the same files
and COMPLETE marker as in the root), then uploads those bytes to the root and
drops the local copy. The local write takes seconds; the upload to a bucket
can outlast the window between a preemption's SIGTERM and its SIGKILL. When
the process dies in between, the machine's disk keeps the newer checkpoint
(a stopped spot VM comes back with its disk and its worker): the next trainer
of the run on this machine verifies it, uploads it and resumes from it. A
damaged local copy, or one the root already has or has passed, is ignored
(and the log says so). A fresh machine has no local copy and resumes from the
root's newest, as always.

    <work dir>/staged-checkpoints/root-<hash of the root's URL>/<run name>/checkpoints/step_000500/
    <work dir>/staged-checkpoints/root-<hash>/<run name>/root.json   {"root": the root's URL}

The run's name is the same on every root, so the directory is keyed by the
root too, and it records the root it stages for: a copy staged for one root is
never uploaded into another (a trainer of the same config on another root,
say a local try beside a bucket run, leaves it alone).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from gpt2.checkpoint import store
from gpt2.config.tree import Config
from gpt2.root import layout, storage

log = logging.getLogger(__name__)

ROOT_RECORD = "root.json"


def staging_dir(config: Config) -> str:
    """This run's local staging directory (a file:// URL), named like the run."""
    return layout.checkpoint_staging_dir(config)


def _step(url: str) -> int:
    marker = store.read_marker(url)
    return marker["step"] if marker else -1


def _record(local: str) -> str:
    return storage.join(local, ROOT_RECORD)


def claim(config: Config) -> None:
    """Record which root this staging directory is for (before any checkpoint is staged)."""
    storage.write_json_atomic(_record(staging_dir(config)), {"root": layout.root(config)})


def _staged_for(local: str) -> str | None:
    try:
        return storage.read_json(_record(local)).get("root")
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def recover(config: Config, fence: Callable[[], None] | None = None) -> str | None:
    """Before a run resumes: upload the newest local checkpoint that verifies
    and is newer than the root's newest complete one; then clear the staging
    directory. Returns the uploaded checkpoint's URL in the root, or None.
    Copies staged for another root, or by a release that did not record the
    root, are never uploaded: they are named in a warning and kept (set aside
    beside the staging directory, or left where the earlier release put them)."""
    _warn_legacy(config)
    local = staging_dir(config)
    if not storage.list_dir(layout.checkpoints_dir(local)):
        return None
    root = layout.root(config)
    staged_for = _staged_for(local)
    if staged_for != root:
        # Set aside, not deleted (they may be another root's newest weights),
        # so this run stages into a directory of its own.
        here = storage.local_path(local)
        aside = here.with_name(f"{here.name}.not-this-root-{time.time_ns()}")
        here.rename(aside)
        log.warning("not uploading the local checkpoints in %s: they were staged for root %s, not this run's "
                    "root %s; moved to %s (delete them, or copy them into their own root by hand)",
                    local, staged_for or "(not recorded)", root, aside)
        return None
    run_dir = layout.run_dir(config)
    root_latest = store.latest_checkpoint(run_dir)
    root_step = _step(root_latest) if root_latest else -1
    uploaded = None
    for url in store.complete_checkpoints(local):
        step = _step(url)
        if uploaded is not None or step <= root_step:
            log.info("ignoring local checkpoint %s (step %d): the root already has step %d", url, step,
                     _step(uploaded) if uploaded else root_step)
            continue
        try:
            ckpt = store.load_checkpoint(url)  # every file against its sha256
        except store.CheckpointError as err:
            log.warning("ignoring damaged local checkpoint: %s", err)
            continue
        target = layout.checkpoint_dir(run_dir, step)
        log.warning("uploading local checkpoint %s (step %d; the root's newest is step %s) to %s: the trainer "
                    "that wrote it stopped before its upload finished", url, step,
                    root_step if root_step >= 0 else "none", target)
        store.write_files(target, ckpt.files, step, fence)
        uploaded = target
    clear(config)
    return uploaded


def _warn_legacy(config: Config) -> None:
    legacy = layout.legacy_checkpoint_staging_dir(config)
    if store.complete_checkpoints(legacy):
        log.warning("local checkpoints in %s were staged by an earlier release, which did not record their "
                    "root: they are not uploaded anywhere; copy them into their root by hand if they are newer "
                    "than its checkpoints, then delete them", legacy)


def clear(config: Config) -> None:
    """Remove this run's local copies (also what --fresh does)."""
    storage.remove(staging_dir(config), recursive=True)
