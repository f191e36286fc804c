"""data.shuffle: a seeded order of shards and sequences per epoch (gpt2.data.order),
the same sequences as the reference order, resumed exactly, on any number of ranks."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gpt2.checkpoint import store
from gpt2.config.identity import data_fingerprint, train_fingerprint
from gpt2.data.loader import TrainLoader, first_reads
from gpt2.data.manifest import load_manifest
from gpt2.data.shard_source import ShardSource
from gpt2.root import layout, storage
from gpt2.train.run import train
from tests.gpt2.data.test_loader import env
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.test_train import weights

SEED = 1337
STEPS_PER_EPOCH = 3 * ((1000 - 1) // 256)  # 3 shards of 1000 tokens, 256-token global batches


@pytest.fixture()
def data(tmp_path):
    config = tiny_config(tmp_path)
    write_dataset(config, train_shards=3, shard_tokens=1000, val_tokens=400)
    return config


def loader(config, tmp_path, seed, rank=0, world=1, micro=4) -> TrainLoader:
    url = layout.manifest(config)
    source = ShardSource(url, load_manifest(url), tmp_path / "cache", env(rank, world))
    return TrainLoader(source, config.model.block_size, 256, micro, env(rank, world), seed)


def sequences(loaders: list[TrainLoader], steps: int) -> list[list[tuple[int, ...]]]:
    """Per step, every sequence of the global batch (inputs and the last target), in rank order."""
    out = []
    for _ in range(steps):
        batch = [b for ld in loaders for b in ld.next_batches()]
        out.append([tuple(x.tolist()) + (int(y[-1]),) for xs, ys in batch for x, y in zip(xs, ys)])
    return out


def test_an_epoch_holds_the_same_sequences_as_the_reference_order_in_another_order(data, tmp_path):
    reference = sequences([loader(data, tmp_path, None)], STEPS_PER_EPOCH)
    shuffled_loader = loader(data, tmp_path, SEED)
    shuffled = sequences([shuffled_loader], STEPS_PER_EPOCH)
    assert Counter(s for step in shuffled for s in step) == Counter(s for step in reference for s in step)
    assert shuffled != reference and shuffled[0] != reference[0]
    assert shuffled_loader.position.epoch == 1
    following = sequences([shuffled_loader], STEPS_PER_EPOCH)  # the next epoch: the same sequences, reordered
    assert Counter(s for step in following for s in step) == Counter(s for step in shuffled for s in step)
    assert following != shuffled


def test_the_targets_are_the_inputs_next_tokens(data, tmp_path):
    (x, y), _ = loader(data, tmp_path, SEED).next_batches()
    assert x.shape == y.shape == (4, 32)
    torch.testing.assert_close(x[:, 1:], y[:, :-1])


def test_a_resumed_loader_on_another_rank_count_continues_the_same_order(data, tmp_path):
    whole = sequences([loader(data, tmp_path, SEED)], 2 * STEPS_PER_EPOCH)
    first = loader(data, tmp_path, SEED)
    sequences([first], 5)  # mid-epoch, mid-shard
    state = first.state_dict()
    ranks = [loader(data, tmp_path, SEED, rank=r, world=2, micro=2) for r in range(2)]
    for ld in ranks:
        ld.load_state_dict(state)
    assert sequences(ranks, 2 * STEPS_PER_EPOCH - 5) == whole[5:]


def test_the_reference_order_and_its_fingerprints_are_unchanged(data, tmp_path):
    ld = loader(data, tmp_path, None)
    x = torch.cat([b[0] for b in ld.next_batches()]).flatten()
    tokens = torch.from_numpy(ld.source.tokens(ld.shards[0])[:256].astype("int64"))
    torch.testing.assert_close(x, tokens)
    shuffled = tiny_config(tmp_path, **{"data.shuffle": True})
    assert data_fingerprint(shuffled) == data_fingerprint(data)  # the same shards serve both orders
    assert train_fingerprint(shuffled) != train_fingerprint(data)
    assert train_fingerprint(tiny_config(tmp_path, **{"data.shuffle": False})) == train_fingerprint(data)


def test_the_first_shard_prefetched_is_the_one_the_shuffled_order_reads_first(data, tmp_path):
    manifest = load_manifest(layout.manifest(data))
    ld = loader(data, tmp_path, SEED)
    assert first_reads(manifest, 256, None, SEED)[-1] == ld.shards[ld.position.shard]



def test_a_shuffled_run_resumed_from_an_earlier_checkpoint_ends_with_the_same_weights(tmp_path):
    config = tiny_config(tmp_path, **{"data.shuffle": True, "train.max_steps": 6, "train.eval_every": 6,
                                      "train.sample_every": 6, "eval.every_steps": 0, "tracking.enabled": False})
    write_dataset(config, train_shards=3, shard_tokens=1000, val_tokens=400)
    first = train(config)
    final = weights(first.checkpoint)
    for url in store.complete_checkpoints(config)[:2]:  # steps 6 and 4 gone: 3-6 are trained again from 2
        storage.remove(storage.join(url, store.MARKER))
        storage.remove(url, recursive=True)
    again = train(config)
    assert again.resumed_from_step == 2 and again.steps == 6
    resumed = weights(again.checkpoint)
    assert all(torch.equal(resumed[k], final[k]) for k in final)
