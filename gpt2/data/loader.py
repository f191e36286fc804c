"""Deterministic training and validation batches from the manifest's shards.

The training stream is defined globally, independent of the device count:
each optimizer step takes one window of `total_batch_tokens + 1` tokens from
the current shard (llm.c's layout: `total_batch_tokens / T` sequences of T
tokens, targets shifted by one). Rank r gets the r-th contiguous slice of the
window and cuts it into micro-batches. The position (shard, offset, epoch) is
global too, so a checkpoint resumed on another number of GPUs continues with
exactly the same global batches.

Where the tokens come from (local or cached remote shards, prefetched) is
gpt2.data.shard_source; the order they are read in (llm.c's, or shuffled with
data.shuffle) is gpt2.data.order.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
import torch

from gpt2.data.llmc import ShardError
from gpt2.data.manifest import Manifest, ShardEntry
from gpt2.data.order import ReadOrder
from gpt2.data.shard_source import ShardSource
from gpt2.process.distributed import DistEnv

log = logging.getLogger(__name__)


@dataclass
class LoaderPosition:
    """Where the next global batch starts; saved in every checkpoint."""

    shard: int = 0
    offset: int = 0
    epoch: int = 0



class TrainLoader:
    """This rank's micro-batches of each global batch, in a fixed order."""

    def __init__(self, source: ShardSource, seq_len: int, total_batch_tokens: int,
                 micro_batch: int, env: DistEnv, shuffle_seed: int | None = None):
        """`shuffle_seed`: None reads in llm.c's order; a seed, in the seeded
        order of gpt2.data.order (data.shuffle)."""
        self.source, self.T, self.env = source, seq_len, env
        self.window = total_batch_tokens
        self.seqs_per_rank = total_batch_tokens // (seq_len * env.world_size)
        self.micro_batch = micro_batch
        self.shards = source.manifest.split("train")
        self.usable = usable_shards(self.shards, self.window)
        if not self.usable:
            raise ShardError(
                f"no train shard holds one global batch ({self.window + 1} tokens); "
                "lower train.total_batch_tokens or raise data.shard_size"
            )
        self.order = ReadOrder(self.usable, shuffle_seed)
        self.position = LoaderPosition(shard=self.order.shards(0)[0])

    @property
    def accumulation_steps(self) -> int:
        return self.seqs_per_rank // self.micro_batch

    def state_dict(self) -> dict:
        return asdict(self.position)

    def load_state_dict(self, state: dict) -> None:
        self.position = LoaderPosition(**state)

    def stand_in_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of the right shape for a step whose own could not be fetched:
        the rank still takes part in the step's collectives, whose flags then
        stop every rank before the step's weights are checkpointed."""
        zeros = torch.zeros((self.micro_batch, self.T), dtype=torch.long)
        return [(zeros, zeros)] * self.accumulation_steps

    def next_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (inputs, targets) micro-batches of this rank for the next step,
        each of shape (micro_batch, T); advances the global position."""
        pos = self.position
        tokens = self.source.tokens(self.shards[pos.shard])
        following = self._following(pos.shard)
        if following != pos.shard:
            self.source.prefetch(self.shards[following])
        if self.order.shuffled:
            inputs, targets = self._shuffled_rows(tokens, pos)
            self._advance()
            return [(inputs[m:m + self.micro_batch], targets[m:m + self.micro_batch])
                    for m in range(0, self.seqs_per_rank, self.micro_batch)]
        rank_tokens = self.seqs_per_rank * self.T
        start = pos.offset + self.env.rank * rank_tokens
        buf = host_tensor(tokens[start:start + rank_tokens + 1], self.env.device)
        self._advance()
        step = self.micro_batch * self.T
        batches = []
        for m in range(self.accumulation_steps):
            chunk = buf[m * step:(m + 1) * step + 1]
            # (B*T + 1,) -> inputs (B, T) and the next-token targets (B, T)
            batches.append((chunk[:-1].view(self.micro_batch, self.T), chunk[1:].view(self.micro_batch, self.T)))
        return batches

    def _shuffled_rows(self, tokens: np.ndarray, pos: LoaderPosition) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's sequences of the next global batch in the shuffled order:
        (inputs, targets), each (seqs_per_rank, T). The offset counts the
        shard's tokens read so far in that order."""
        T = self.T
        # The sequences the reference order reads (whole global batches): the same multiset per epoch.
        order = self.order.sequences(pos.epoch, pos.shard, (len(tokens) - 1) // self.window * (self.window // T))
        first = pos.offset // T + self.env.rank * self.seqs_per_rank
        starts = order[first:first + self.seqs_per_rank].astype(np.int64) * T
        # (seqs, 1) + (1, T) -> (seqs, T) token indices; the targets are the next tokens
        rows = starts[:, None] + np.arange(T)
        return (host_tensor(tokens[rows].reshape(-1), self.env.device).view(-1, T),
                host_tensor(tokens[rows + 1].reshape(-1), self.env.device).view(-1, T))

    def _advance(self) -> None:
        pos = self.position
        pos.offset += self.window
        # In either order a shard gives (tokens - 1) // T sequences: as many whole global batches as fit.
        if pos.offset + self.window + 1 <= self.shards[pos.shard].tokens:
            return
        following, epoch = self.order.following(pos.shard, pos.epoch)
        self.position = LoaderPosition(shard=following, offset=0, epoch=epoch)
        if epoch > pos.epoch:
            log.info("train split exhausted: starting epoch %d", epoch)

    def _following(self, shard: int) -> int:
        """The shard read after `shard` (this epoch's next, else the next epoch's first)."""
        return self.order.following(shard, self.position.epoch)[0]


def usable_shards(shards: list[ShardEntry], window: int) -> list[int]:
    """The train shards (their indices) that hold one global batch of `window` tokens and its target."""
    return [i for i, s in enumerate(shards) if s.tokens >= window + 1]


def first_reads(manifest: Manifest, total_batch_tokens: int, state: dict | None,
                shuffle_seed: int | None = None) -> list[ShardEntry]:
    """The shards a run reads first: the val split's first shard, and the train
    shard its loader starts in (`state`: the checkpoint's loader state, if any;
    `shuffle_seed` as the loader's), for a prefetch while the model is built,
    probed and compiled."""
    train = manifest.split("train")
    usable = usable_shards(train, total_batch_tokens)
    first = ReadOrder(usable, shuffle_seed).shards(0)[0] if usable else None
    start = train[state["shard"]] if state else (train[first] if usable else None)
    return [s for s in (manifest.split("val")[:1] + [start]) if s is not None]


def host_tensor(tokens: np.ndarray, device: torch.device) -> torch.Tensor:
    """`tokens` as int64 on the host, in pinned memory when they go to a GPU:
    a copy from pinned memory with non_blocking=True is really asynchronous."""
    buf = torch.empty(len(tokens), dtype=torch.int64, pin_memory=device.type == "cuda")
    np.copyto(buf.numpy(), tokens)  # uint16 -> int64 straight into the buffer
    return buf


def val_batches(source: ShardSource, seq_len: int, max_tokens: int, micro_batch: int,
                env: DistEnv) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed validation set: the first `max_tokens` tokens of the val split
    as non-overlapping sequences, dealt round-robin to ranks, in micro-batches."""
    want = max(1, max_tokens // seq_len)
    seqs: list[np.ndarray] = []
    for entry in source.manifest.split("val"):
        tokens = source.tokens(entry)
        n = min((len(tokens) - 1) // seq_len, want - len(seqs))
        # (n*T + 1,) -> n overlapping (T + 1,) windows: inputs plus shifted targets
        seqs.extend(tokens[i * seq_len:(i + 1) * seq_len + 1] for i in range(n))
        if len(seqs) >= want:
            break
    if not seqs:
        raise ShardError(f"the val split holds fewer than {seq_len + 1} tokens; raise data.val_tokens")
    mine = np.stack(seqs[env.rank::env.world_size]).astype(np.int64) if len(seqs) > env.rank else None
    if mine is None:
        return []
    data = torch.from_numpy(mine)
    pin = env.device.type == "cuda"  # copied to the device at every validation: pinned, they go asynchronously
    return [(_pinned(b[:, :-1], pin), _pinned(b[:, 1:], pin)) for b in data.split(micro_batch)]


def _pinned(t: torch.Tensor, pin: bool) -> torch.Tensor:
    return t.contiguous().pin_memory() if pin else t.contiguous()
