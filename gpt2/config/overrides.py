"""Resolve a preset plus dotted `key=value` overrides into a validated Config.

Every problem (unknown preset, unknown key, bad value) is collected and
reported at once in a single ConfigError.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ValidationError

from gpt2.config.presets import PRESETS
from gpt2.config.tree import Config
from gpt2.secrets import redact


class ConfigError(ValueError):
    """Invalid configuration; `problems` lists every issue found."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            "invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems)
        )


REFERENCE_NAMES = {
    # nanoGPT's train.py configurator
    "learning_rate": "train.lr", "max_iters": "train.max_steps", "lr_decay_iters": "train.max_steps",
    "warmup_iters": "train.warmup_steps", "min_lr": "train.min_lr_ratio", "batch_size": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.total_batch_tokens", "beta1": "train.betas", "beta2": "train.betas",
    "eval_interval": "train.eval_every", "eval_iters": "train.val_steps", "dtype": "train.precision",
    "out_dir": "runtime.root", "dataset": "data.source", "wandb_log": "tracking.enabled",
    "always_save_checkpoint": "train.checkpoint_every",
    # llm.c's train_gpt2.py / train_gpt2.cu flags, spelled out
    "num_iterations": "train.max_steps", "total_batch_size": "train.total_batch_tokens",
    "sequence_length": "model.block_size", "learning_rate_decay_frac": "train.min_lr_ratio",
    "val_loss_every": "train.eval_every", "val_max_steps": "train.val_steps", "output_dir": "runtime.root",
}
"""Names people bring from the reference projects (nanoGPT, llm.c), section or none, and ours."""


def closest(name: str, known: Iterable[str], cutoff: float = 0.6) -> list[str]:
    """What a mistyped key or preset most likely meant: the keys with the same
    last part in another section (`model.max_steps` -> train.max_steps, `n_layer`
    -> model.n_layer), a reference project's name for it (`learning_rate` ->
    train.lr, `max_iters` -> train.max_steps), else the nearest spellings
    (`train.max_step` -> train.max_steps, `small` -> smoke)."""
    known = sorted(known)
    leaf = name.split(".")[-1]
    same_leaf = [k for k in known if "." in k and k.split(".")[-1] == leaf]
    ours = [REFERENCE_NAMES[leaf]] if REFERENCE_NAMES.get(leaf) in known else []
    return list(dict.fromkeys(ours + same_leaf)) or difflib.get_close_matches(name, known, n=2, cutoff=cutoff)


def _where(loc: tuple) -> str:
    """A field's dotted key; an item of a list field by its index
    (`runtime.gpu_pools[1].price_per_hour`)."""
    where = ".".join(str(p) for p in loc[:2]) or "config"
    if len(loc) > 2 and isinstance(loc[2], int):
        where += f"[{loc[2]}]" + "".join(f".{p}" for p in loc[3:4])
    return where


def parse_value(text: str) -> Any:
    """`--set` values are JSON when they parse as JSON (numbers, true, null,
    lists), plain strings otherwise, so `data.source=gs://b/x` needs no quotes."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """Turn ["a.b=1", ...] into {"a.b": 1}; malformed items become problems."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"override {item!r} is not of the form key=value (e.g. train.max_steps=100)")
            continue
        out[key.strip()] = parse_value(value)
    return out, problems


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_known_keys(ann, f"{prefix}{name}."))
        else:
            keys.append(prefix + name)
    return keys


KNOWN_KEYS = frozenset(_known_keys(Config))


def apply_overrides(base: Config, overrides: Mapping[str, Any]) -> tuple[dict, list[str]]:
    tree = base.model_dump()
    problems = []
    for key, value in overrides.items():
        if key not in KNOWN_KEYS:
            hint = " or ".join(closest(key, KNOWN_KEYS))
            problems.append(f"unknown key {key!r}" + (f" (did you mean {hint}?)" if hint else ""))
            continue
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return tree, problems


def resolve_config(
    preset: str = "smoke",
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    root: str | None = None,
) -> Config:
    """Build the config of `preset` with `overrides` (a mapping of dotted keys or
    a list of "key=value" strings); `root` sets runtime.root."""
    problems: list[str] = []
    if isinstance(overrides, Mapping):
        values = dict(overrides)
    else:
        values, problems = parse_assignments(overrides or [])
    if root is not None:
        values["runtime.root"] = root
    if preset not in PRESETS:
        hint = " or ".join(closest(preset, PRESETS, cutoff=0.4))  # few, short names: `small` -> smoke
        problems.append(f"unknown preset {preset!r}" + (f" (did you mean {hint}?)" if hint else "")
                        + f"; choose one of {', '.join(sorted(PRESETS))}")
        raise ConfigError(problems)
    tree, more = apply_overrides(PRESETS[preset](), values)
    problems += more
    try:
        config = Config.model_validate(tree)
    except ValidationError as err:
        # A field that takes one of several kinds (an int or `epoch`, a bool or
        # `auto`) fails once per kind: one problem per field, its reasons joined.
        by_field: dict[str, list[dict]] = {}
        for e in err.errors():
            by_field.setdefault(_where(e["loc"]), []).append(e)
        for where, errs in by_field.items():
            e = errs[0]
            got = f" (got {e.get('input')!r})" if e["loc"] and not isinstance(e.get("input"), dict) else ""
            reasons = " or ".join(dict.fromkeys(x["msg"] for x in errs))
            problems.append(redact(f"{where}: {reasons}{got}"))
        config = None
    if problems:
        raise ConfigError(problems)
    return config
