"""Every stage's identity: what defines its result (never runtime settings).

A data fingerprint names the shard directory and keys the data tasks' caches;
a training fingerprint (model + data + train) names the run, so evaluation or
export settings never re-address a checkpoint; the evaluate and export
identities start from the content hash of the weights they read, so the same
weights under another root hit the same cache.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from gpt2.config.data import DataConfig, builtin_digest
from gpt2.config.sections import EvalConfig
from gpt2.config.train import SCRATCH
from gpt2.config.tree import Config

# Bump when a change to the code changes results for the same config, so old
# caches and shard directories are not reused by mistake.
DATA_FORMAT_VERSION = 1
TRAIN_FORMAT_VERSION = 1
EVAL_FORMAT_VERSION = 1
# 2: config.json names n_ctx, generation_config.json caps the length, the HF
# directory holds its model card (README.md), the registered model serves.
EXPORT_FORMAT_VERSION = 2


def fingerprint(obj: Any, length: int = 16) -> str:
    """Stable short hash of a JSON-able object or pydantic model."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


# Keys added to DataConfig after data was first prepared, with the value the
# older code behaved as: at that value a key is left out of the identity, so
# data prepared before the key existed keeps its fingerprint and its address.
# max_document_chars: the older code did not cut documents, so at the default
# the tokens differ only for a source holding a document over 1M characters
# (about 250k tokens); such data is kept, with that document whole.
# source_format and val_split: `auto` and `head` are how the older code read and split.
ADDED_DATA_KEYS = {k: DataConfig.model_fields[k].default for k in ("max_document_chars", "source_format", "val_split")}


# DataConfig keys that choose how training reads the shards, not what they hold:
# part of a run's identity (train_identity), never of the data's, so both
# orders read the same shards.
READ_ORDER_KEYS = ("shuffle",)


def data_identity(config: Config) -> dict:
    data = config.data.model_dump(mode="json")
    data = {k: v for k, v in data.items() if k not in ADDED_DATA_KEYS or v != ADDED_DATA_KEYS[k]}
    data = {k: v for k, v in data.items() if k not in READ_ORDER_KEYS}
    ident = {"data": data, "format": DATA_FORMAT_VERSION}
    if config.data.source.startswith("builtin:"):
        # A built-in sample's text comes from the installed Python: hash it so
        # another Python version never reuses shards made from other text.
        ident["builtin_digest"] = builtin_digest(config.data.source)
    return ident


# What each data step's output depends on: changing the shard size re-shards
# but never re-tokenizes (hours at 10B tokens); changing limits re-tokenizes
# but never re-downloads.
DATA_STEP_FIELDS = {
    "download": ("source", "source_format"),
    "tokenize": ("source", "source_format", "text_field", "max_documents", "max_tokens", "max_document_chars",
                 "tokenizer"),
}


def data_step_fingerprint(config: Config, step: str) -> str:
    """Fingerprint of one data step (download, tokenize, shard, upload)."""
    ident = data_identity(config)
    fields = DATA_STEP_FIELDS.get(step)
    if fields is not None:
        ident = {**ident, "data": {k: ident["data"][k] for k in fields if k in ident["data"]}}
    return fingerprint({"step": step if fields else "all", **ident})


# Train settings that never change the weights: how the global batch is
# split into micro-batches (the OOM error tells users to change it), and how
# often the run validates, samples and checkpoints. Changing one continues
# the same run.
TRAIN_RUNTIME_FIELDS = frozenset({"micro_batch_size", "checkpoint_every", "keep_checkpoints", "eval_every",
                                  "sample_every"})


# The optimizer's keys, added after runs were first trained: with AdamW (what
# the older code ran) they are left out, so those runs keep their address;
# Muon's own settings count only when Muon runs.
OPTIMIZER_KEYS = ("optimizer", "muon_lr", "muon_momentum")

# Settings added later that never change the weights: left out of every
# identity (the legacy one too), so no run changes its address for them.
# precision: the arithmetic the device computes the same training in, chosen
# by the hardware as the device is (`auto`): a run moves between a bf16 and an
# fp16 GPU and keeps its checkpoints (gpt2.train.precision).
NEVER_IDENTITY_KEYS = ("preflight", "precision")

# The loss-spike keys (gpt2.train.spikes), added after runs were first
# trained: they change the weights only where a spike changes what is trained
# (on_spike skip or rollback, detection on); otherwise (`warn`, or
# spike_zscore 0) the run trains exactly as the older code did and they are
# left out, so it keeps its address. max_rollbacks counts with rollback only.
SPIKE_KEYS = ("spike_zscore", "on_spike", "max_rollbacks", "spike_window")


# Where the weights start (train.init_from, gpt2.weights.init), added after runs
# were first trained: `scratch` (what the older code did) leaves both keys out,
# so every scratch run keeps its address. A fine-tune is named by the content of
# its weights (init_sha256, filled in when they are fetched into the root), not
# by where they were read: the same weights from a copy elsewhere continue the
# run, other weights are another run. A config not yet resolved (no sha256) is
# named by its source, which no trainer ever uses: training resolves it first.
INIT_KEYS = ("init_from", "init_sha256")


def _init_keys_left_out(train: dict) -> tuple[str, ...]:
    if train["init_from"] == SCRATCH:
        return INIT_KEYS
    return ("init_from",) if train["init_sha256"] else ("init_sha256",)


def _spike_keys_left_out(train: dict) -> tuple[str, ...]:
    if train["spike_zscore"] == 0 or train["on_spike"] == "warn":
        return SPIKE_KEYS
    return ("max_rollbacks",) if train["on_spike"] == "skip" else ()


def train_identity(config: Config, legacy: bool = False) -> dict:
    """What defines a run's weights. `legacy`: the identity of releases
    before 0.2, which counted TRAIN_RUNTIME_FIELDS too (their runs are
    resumed, see gpt2.train.session)."""
    train = {k: v for k, v in config.train.model_dump(mode="json").items() if k not in NEVER_IDENTITY_KEYS}
    if train["optimizer"] == "adamw":
        train = {k: v for k, v in train.items() if k not in OPTIMIZER_KEYS}
    train = {k: v for k, v in train.items() if k not in _spike_keys_left_out(train) + _init_keys_left_out(train)}
    if not legacy:
        train = {k: v for k, v in train.items() if k not in TRAIN_RUNTIME_FIELDS}
    ident = {
        "model": config.model.model_dump(mode="json"),
        "data": data_identity(config),
        "train": train,
        "format": TRAIN_FORMAT_VERSION,
    }
    if config.data.shuffle:  # the reference order adds nothing: today's runs keep their address
        ident["data_order"] = {"shuffle": True}
    return ident


def data_fingerprint(config: Config) -> str:
    return fingerprint(data_identity(config))


def train_fingerprint(config: Config) -> str:
    return fingerprint(train_identity(config))


def legacy_train_fingerprint(config: Config) -> str:
    return fingerprint(train_identity(config, legacy=True))


def model_data_fingerprint(config: Config) -> str:
    """Model + data only: runs that share it differ in training settings alone."""
    return fingerprint({"model": config.model.model_dump(mode="json"), "data": data_identity(config)})


# Keys added to EvalConfig after evaluations were first cached, with the value the older code
# behaved as (HellaSwag alone): at that value a key is left out, so an evaluation cached before
# the key existed keeps its cache key.
ADDED_EVAL_KEYS = ("tasks", "core_bundle", "max_per_task", "lm_eval_include")
# Eval keys only the training loop reads (what it logs as it trains): they change neither the weights
# (no eval key is in a run's identity) nor what the evaluate stage scores, so no fingerprint holds them.
IN_LOOP_EVAL_KEYS = ("core_every",)


def eval_identity(config: Config) -> dict:
    dumped, defaults = config.eval.model_dump(mode="json"), EvalConfig().model_dump(mode="json")
    return {k: v for k, v in dumped.items()
            if k not in IN_LOOP_EVAL_KEYS and (k not in ADDED_EVAL_KEYS or v != defaults[k])}


def eval_fingerprint(config: Config, model_sha256: str) -> str:
    """An evaluation: the weights and the eval settings."""
    return fingerprint({"weights": model_sha256, "eval": eval_identity(config), "format": EVAL_FORMAT_VERSION})


def export_files_fingerprint(model_sha256: str) -> str:
    """The exported files depend on the weights alone."""
    return fingerprint({"weights": model_sha256, "format": EXPORT_FORMAT_VERSION})


def register_fingerprint(config: Config, model_sha256: str) -> str:
    """A model registration: the weights, where and under which name."""
    return fingerprint({"weights": model_sha256, "export": config.export.model_dump(mode="json"),
                        "tracking": config.tracking.model_dump(mode="json")})
