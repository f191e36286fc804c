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

    <work dir>/staged-checkpoints/<run name>/checkpoints/step_000500/
"""

from __future__ import annotations

import logging
from typing import Callable

from gpt2 import layout, storage
from gpt2.checkpoint import store
from gpt2.config import Config

log = logging.getLogger(__name__)


def staging_dir(config: Config) -> str:
    """This run's local staging directory (a file:// URL), named like the run."""
    return layout.checkpoint_staging_dir(config)


def _step(url: str) -> int:
    marker = store.read_marker(url)
    return marker["step"] if marker else -1


def recover(config: Config, fence: Callable[[], None] | None = None) -> str | None:
    """Before a run resumes: upload the newest local checkpoint that verifies
    and is newer than the root's newest complete one; then clear the staging
    directory. Returns the uploaded checkpoint's URL in the root, or None."""
    local = staging_dir(config)
    if not storage.list_dir(layout.checkpoints_dir(local)):
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


def clear(config: Config) -> None:
    """Remove this run's local copies (also what --fresh does)."""
    storage.remove(staging_dir(config), recursive=True)
