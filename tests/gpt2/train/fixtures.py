"""A tiny training setup for tests: a small config and synthetic llm.c shards
with a manifest, written where the data stage would put them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gpt2.config.overrides import resolve_config
from gpt2.config.tree import Config
from gpt2.data import synthetic

TINY = {
    "data.name": "synthetic",
    "data.source": "synthetic",
    "model.n_layer": 2, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
    "train.total_batch_tokens": 256, "train.micro_batch_size": 4,
    "train.max_steps": 8, "train.warmup_steps": 2, "train.lr": 3e-3, "train.min_lr_ratio": 0.1,
    "train.eval_every": 4, "train.val_steps": 2, "train.sample_every": 8,
    "train.checkpoint_every": 2, "train.keep_checkpoints": 3,
    # In-loop HellaSwag on 4 of the format sample's 31 items: the same scorer
    # and sum over ranks, at an eighth of its cost in every tiny run.
    "eval.limit": 4,
    "runtime.device": "cpu",
    # The training flow's preflight (a child process, steps of its own) has its
    # own tests (tests/gpt2/preflight, tests/flows/test_train_preflight.py).
    "train.preflight": False,
}


def tiny_config(root: str | Path, **overrides) -> Config:
    """The tiny config with its artifact root at `root` (a local scratch
    directory gets `root/work` as the work dir)."""
    values = dict(TINY)
    if isinstance(root, Path):
        values["runtime.work_dir"] = str(root / "work")
    values.update(overrides)
    return resolve_config("smoke", values, root=str(root))


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    # Repeated short "sentences" over a small vocabulary: learnable, so the
    # loss falls, and documents start with end-of-text like real shards.
    phrases = rng.integers(0, 2000, size=(64, 12))
    out = []
    while sum(map(len, out)) < n:
        out.append(np.array([50256]))
        out.extend(phrases[rng.integers(0, 64, size=rng.integers(3, 10))])
    return np.concatenate(out)[:n].astype(np.uint16)


def write_dataset(config: Config, train_shards: int = 2, shard_tokens: int = 4096,
                  val_tokens: int = 1024, seed: int = 0) -> str:
    """Write shards + manifest.json for `config`; returns the manifest URL."""
    rng = np.random.default_rng(seed)
    plan = [("val", val_tokens)] + [("train", shard_tokens)] * train_shards
    return synthetic.write_dataset(config, [(split, _tokens(rng, n)) for split, n in plan],
                                   {"kind": "synthetic", "seed": seed})


POISON_TOKEN = 40000
"""Never among the learnable phrases (tokens below 2000): a batch of it is a loss spike."""


def write_poisoned_dataset(config: Config, poisoned_steps: tuple[int, ...], train_shards: int = 4,
                           shard_tokens: int = 4096, val_tokens: int = 1024, seed: int = 0) -> str:
    """`write_dataset`, with the batches of the given steps (1-based, in the
    reference order, first epoch) made of one repeated token: a stretch of
    poisoned data the run meets at those steps."""
    rng = np.random.default_rng(seed)
    window = config.train.total_batch_tokens
    per_shard = (shard_tokens - 1) // window
    shards = [_tokens(rng, shard_tokens) for _ in range(train_shards)]
    for step in poisoned_steps:
        shard, batch = divmod(step - 1, per_shard)
        shards[shard][batch * window:(batch + 1) * window + 1] = POISON_TOKEN
    plan = [("val", _tokens(rng, val_tokens))] + [("train", tokens) for tokens in shards]
    return synthetic.write_dataset(config, plan, {"kind": "synthetic-poisoned", "seed": seed,
                                                  "poisoned_steps": list(poisoned_steps)})


def write_run_json(config: Config, path: Path) -> Path:
    path.write_text(json.dumps(config.model_dump(mode="json")))
    return path


def saved_bytes(model, batch: int) -> int:
    """What one forward pass of `model` at `batch` sequences of its block size
    saves for backward, weights left out (as the CPU memory emulation counts it)."""
    import torch

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    sizes = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    seq = model.config.block_size
    x = torch.randint(0, model.config.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x[:, :-1], x[:, 1:], return_logits=False)
    return sum(sizes.values())
