"""The order training reads the train split in (gpt2.data.loader).

By default llm.c's reference order: the usable shards in turn, each read front
to back, the same every epoch. With `data.shuffle` a seeded order instead:
each epoch a permutation of the shards, and within each shard a permutation of
the sequences the reference order reads from it (T + 1 tokens, inputs and
their shifted targets, cut at multiples of T; the whole global batches that
fit), so an epoch holds the same sequences in either order. Every permutation is a pure
function of (seed, epoch[, shard]), so the loader's position (shard, offset,
epoch) with the offset counted in the permuted order is all a resumed run
needs, on any number of ranks: a global batch is the next
`total_batch_tokens / T` sequences of that order, and rank r takes the r-th
contiguous slice of them, as in the reference order. Unshuffled shards
(FineWeb-edu's are sorted by source) cause llm.c's periodic loss oscillation
(build-nanogpt PR #52, modded-nanogpt #174).
"""

from __future__ import annotations

import numpy as np


class ReadOrder:
    """The shards of each epoch and the sequences of each shard, in reading order."""

    def __init__(self, usable: list[int], seed: int | None):
        """`usable`: the train shards that hold a global batch; `seed`: None
        for the reference order, else the permutations' seed (train.seed)."""
        self.usable, self.seed = list(usable), seed
        self._cached: tuple[tuple[int, int], np.ndarray] | None = None

    @property
    def shuffled(self) -> bool:
        return self.seed is not None

    def shards(self, epoch: int) -> list[int]:
        if not self.shuffled:
            return self.usable
        rng = np.random.default_rng([self.seed, epoch])
        return [self.usable[i] for i in rng.permutation(len(self.usable))]

    def following(self, shard: int, epoch: int) -> tuple[int, int]:
        """The shard read after `shard` in `epoch`, and its epoch."""
        order = self.shards(epoch)
        if not self.shuffled or shard not in order:  # the reference order: the next one up, else the first
            later = [i for i in self.usable if i > shard]
            return (later[0], epoch) if later else (self.usable[0], epoch + 1)
        at = order.index(shard)
        return (order[at + 1], epoch) if at + 1 < len(order) else (self.shards(epoch + 1)[0], epoch + 1)

    def sequences(self, epoch: int, shard: int, count: int) -> np.ndarray:
        """The reading order of a shard's `count` sequences in `epoch` (shuffled orders only)."""
        key = (epoch, shard)
        if self._cached is None or self._cached[0] != key or len(self._cached[1]) != count:
            self._cached = (key, np.random.default_rng([self.seed, epoch, shard]).permutation(count))
        return self._cached[1]
