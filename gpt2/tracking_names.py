"""What MLflow accepts: metric names, params as flat strings, and how many of
each one log_batch call may carry (gpt2.tracking sends within these)."""

from __future__ import annotations

import re

MAX_METRICS_PER_BATCH, MAX_PARAMS_PER_BATCH, MAX_PARAM_CHARS = 1000, 100, 6000  # MLflow's log_batch limits


def metric_name(key: str) -> str:
    """MLflow accepts letters, digits and `_-. :/` only (lm-eval emits `acc,none`)."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 6e-4}} -> {"train.lr": "0.0006"} for MLflow params."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:MAX_PARAM_CHARS]
    return out
