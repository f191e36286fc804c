"""How long a run trains: `train.max_steps`, with `epoch` resolved from the
prepared train split.

`epoch` is one pass over the train split the data stage wrote: its tokens
(from the split's manifest in the root) // train.total_batch_tokens. A run's
identity includes its step count, so every stage resolves `epoch` here before
it derives anything from the config: train, evaluate and export then name the
same run, and an `epoch` run is the very run given that number by hand.
"""

from __future__ import annotations

from gpt2.config.tree import Config
from gpt2.data.manifest import load_manifest
from gpt2.errors import UserError
from gpt2.root import layout, storage

EPOCH = "epoch"
ASSUMED_TRAIN_TOKENS = 10_000_000_000
"""What `gpt2 plan` assumes an epoch holds before the data stage has run: the
~10B tokens of FineWeb-edu sample-10BT (19,073 steps of 524,288 tokens)."""


class EpochUnknown(UserError):
    """`train.max_steps=epoch` without a usable train split; says what to do."""


def epoch_steps(train_tokens: int, total_batch_tokens: int) -> int:
    """Whole global batches in one pass over `train_tokens` (the tail is dropped)."""
    return train_tokens // total_batch_tokens


def resolve_max_steps(config: Config) -> int:
    """`train.max_steps` as a number: itself, or one epoch of the prepared train split."""
    steps = config.train.max_steps
    if steps != EPOCH:
        return int(steps)
    url = layout.manifest(config)
    try:
        manifest = load_manifest(url)
    except FileNotFoundError:
        raise EpochUnknown(
            f"train.max_steps=epoch needs the prepared train split, but there is no data manifest at {url}: "
            "run the data stage first (gpt2 prepare with the same preset, --set and --root) "
            "or set train.max_steps=N") from None
    tokens, batch = manifest.split_tokens("train"), config.train.total_batch_tokens
    steps = epoch_steps(tokens, batch)
    if steps < 1:
        raise EpochUnknown(
            f"train.max_steps=epoch: the prepared train split ({url}) holds {tokens:,} tokens, less than one "
            f"global batch (train.total_batch_tokens={batch:,}): prepare more data (data.max_tokens, "
            "data.source), lower train.total_batch_tokens, or set train.max_steps=N")
    return steps


def with_resolved_steps(config: Config, required: bool = True) -> Config:
    """The config with `train.max_steps` a number. With `required=False` an
    `epoch` that cannot be resolved yet (no data stage run) is left as it is,
    for callers that do not need the run's identity."""
    if config.train.max_steps != EPOCH:
        return config
    try:
        steps = resolve_max_steps(config)
    except EpochUnknown:
        if required:
            raise
        return config
    return config.model_copy(update={"train": config.train.model_copy(update={"max_steps": steps})})


def steps_for_checkpoint(config: Config, checkpoint: str | None) -> Config:
    """The config as the evaluate and export stages resolve it for `checkpoint`:
    `train.max_steps=epoch` resolved as the train stage resolved it, so `latest`
    finds the same run; a named checkpoint needs no run name, so no data stage."""
    return with_resolved_steps(config, required=checkpoint in (None, "", "latest"))


def planned_steps(config: Config) -> tuple[int, str, str | None]:
    """For `gpt2 plan`, before anything runs: (steps, where they come from, a
    note). `set`: train.max_steps is a number; `manifest`: one epoch of the
    root's prepared train split; `assumed`: `epoch` before the data stage has
    run, so ASSUMED_TRAIN_TOKENS, or the count published for the data
    (gpt2.report.reference_lines.TRAIN_TOKENS: OpenWebText's), or data.max_tokens less
    the val split when that is smaller, stand in for the split."""
    if config.train.max_steps != EPOCH:
        return int(config.train.max_steps), "set", None
    url = layout.manifest(config)
    try:
        steps = resolve_max_steps(config)
        return steps, "manifest", f"one epoch of the prepared train split ({url})"
    except EpochUnknown as err:
        if storage.exists(url):  # prepared, but smaller than one batch: that is the answer
            raise err
        why = "the data stage has not run for this config and root"
    except UserError as err:  # a damaged manifest: say so, and plan on the assumption
        why = str(err).split(";")[0]
    from gpt2.report.reference_lines import TRAIN_TOKENS, dataset_of

    tokens = TRAIN_TOKENS.get(dataset_of({"data.name": config.data.name, "data.source": config.data.source}) or "",
                              ASSUMED_TRAIN_TOKENS)
    if config.data.max_tokens is not None:
        tokens = min(tokens, max(config.data.max_tokens - config.data.val_tokens, 0))
    steps = max(1, epoch_steps(tokens, config.train.total_batch_tokens))
    return steps, "assumed", (f"train.max_steps=epoch: unknown until the data stage has run ({why}); "
                              f"assumed {steps:,} steps for ~{tokens / 1e9:.2f}B train tokens")
