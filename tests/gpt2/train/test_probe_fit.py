"""The micro-batch `auto` picks survives real training: several steps on two
gloo ranks (DDP, and ZeRO-1 or recomputation where the search chose them)
under the same runtime.memory_limit_mb, for a model shaped like GPT-2 1558M."""

from __future__ import annotations

import math

from gpt2.model import GPT
from gpt2.train import memory
from tests.gpt2.train.fixtures import saved_bytes, tiny_config, write_dataset
from tests.gpt2.train.test_train_process import run_to_end
from tests.tiers import SCENARIO

pytestmark = SCENARIO

# gpt2-1558m is 48 layers, 1600 channels, 25 heads: the layers and channels
# divided by 16 (the same depth for its width), the heads kept.
SCALE = 16
SHAPE = {"model.n_layer": 48 // SCALE, "model.n_embd": 1600 // SCALE, "model.n_head": 25}
RANKS, SEQS_PER_RANK, T = 2, 8, 64


def test_the_size_auto_picks_survives_several_real_steps_under_the_limit(tmp_path):
    overrides = {**SHAPE, "model.block_size": T, "train.total_batch_tokens": RANKS * SEQS_PER_RANK * T,
                 "train.micro_batch_size": "auto", "train.max_steps": 4, "train.eval_every": 4,
                 "train.val_steps": 1, "train.checkpoint_every": 4, "train.sample_every": 4}
    config = tiny_config(tmp_path, **overrides)
    model = GPT(config.model)
    # Halfway between what the whole per-rank batch and half of it need in
    # plain steps: the plain full size cannot fit, so the search must give
    # something up (the size, or a saver), and what it keeps is then trained.
    half, full = saved_bytes(model, SEQS_PER_RANK // 2), saved_bytes(model, SEQS_PER_RANK)
    limit_mb = math.ceil((memory.static_bytes(model) + (half + full) / 2) / memory.MB)
    config = tiny_config(tmp_path, **overrides, **{"runtime.memory_limit_mb": limit_mb})
    write_dataset(config, val_tokens=2 * config.train.total_batch_tokens)
    result = run_to_end(config, tmp_path, torchrun=RANKS)
    assert result["steps"] == config.train.max_steps and result["world_size"] == RANKS
    assert (result["micro_batch_size"] < SEQS_PER_RANK or result["shard_optimizer"] or result["recompute"])
