"""Which checkpoint the evaluate and export stages read, and its identity.

`--checkpoint latest` (or none) means the newest complete checkpoint of the
config's training run; a URL names one checkpoint directory. The identity of
what a stage reads is the content hash of the weights (from the checkpoint's
COMPLETE marker), so the same weights under another root hit the same cache.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from gpt2.checkpoint.catalog import MARKER, latest_checkpoint, read_marker
from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.root import layout, storage


class CheckpointNotFound(UserError, FileNotFoundError):
    """No complete checkpoint where one was expected; the message says where."""


@dataclass(frozen=True)
class CheckpointRef:
    url: str
    """The checkpoint directory (…/runs/{run}/checkpoints/step_000060)."""
    step: int
    model_sha256: str
    """sha256 of model.safetensors, as recorded in the COMPLETE marker."""

    @property
    def run_dir(self) -> str:
        return posixpath.dirname(posixpath.dirname(self.url.rstrip("/")))

    @property
    def run_name(self) -> str:
        return posixpath.basename(self.run_dir)

    @property
    def step_name(self) -> str:
        return layout.step_name(self.step)

    def output_dir(self, root: str, stage: str) -> str:
        """Where a stage writes what it derives from this checkpoint:
        {root}/runs/{run}/{stage}/step_000060 (the checkpoint's own run
        directory when it lives under `root`)."""
        return layout.stage_output_dir(root, self.run_name, stage, self.step)


def resolve_checkpoint(config: Config, checkpoint: str | None = "latest") -> CheckpointRef:
    """The checkpoint to read: the latest complete one of the config's run, or
    the directory `checkpoint` names (which must be complete)."""
    if checkpoint in (None, "", "latest"):
        url = latest_checkpoint(config)
        if url is None:
            raise CheckpointNotFound(
                f"no complete checkpoint under {layout.run_dir(config)}/checkpoints; train first "
                "(gpt2 train with the same preset and --set options) or pass --checkpoint URL"
            )
    else:
        url = storage.normalize_url(checkpoint)
    marker = read_marker(url)
    if marker is None:
        raise CheckpointNotFound(f"checkpoint {url} does not exist or is incomplete (no valid {MARKER} marker)")
    # read_marker returns only well-formed markers (a step, every file's size and sha256).
    return CheckpointRef(url=url, step=marker["step"], model_sha256=marker["files"]["model.safetensors"]["sha256"])
