"""Deterministic training and validation batches from the manifest's shards.

The training stream is defined globally, independent of the device count:
each optimizer step takes one window of `total_batch_tokens + 1` tokens from
the current shard (llm.c's layout: `total_batch_tokens / T` sequences of T
tokens, targets shifted by one). Rank r gets the r-th contiguous slice of the
window and cuts it into micro-batches. The position (shard, offset, epoch) is
global too, so a checkpoint resumed on another number of GPUs continues with
exactly the same global batches.

Where the tokens come from (local or cached remote shards, prefetched) is
gpt2.data.shard_source.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
import torch

from gpt2.data.llmc import ShardError
from gpt2.data.manifest import Manifest, ShardEntry
from gpt2.data.shard_source import ShardSource
from gpt2.distributed import DistEnv

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
                 micro_batch: int, env: DistEnv):
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
        self.position = LoaderPosition(shard=self.usable[0])

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

    def _advance(self) -> None:
        pos = self.position
        pos.offset += self.window
        if pos.offset + self.window + 1 <= self.shards[pos.shard].tokens:
            return
        following = self._following(pos.shard)
        if following > pos.shard:
            self.position = LoaderPosition(shard=following, offset=0, epoch=pos.epoch)
        else:
            self.position = LoaderPosition(shard=following, offset=0, epoch=pos.epoch + 1)
            log.info("train split exhausted: starting epoch %d", pos.epoch + 1)

    def _following(self, shard: int) -> int:
        """The usable shard after `shard`: the next one in order, else the first (a new epoch)."""
        later = [i for i in self.usable if i > shard]
        return later[0] if later else self.usable[0]


def usable_shards(shards: list[ShardEntry], window: int) -> list[int]:
    """The train shards (their indices) that hold one global batch of `window` tokens and its target."""
    return [i for i, s in enumerate(shards) if s.tokens >= window + 1]


def first_reads(manifest: Manifest, total_batch_tokens: int, state: dict | None) -> list[ShardEntry]:
    """The shards a run reads first: the val split's first shard, and the train
    shard its loader starts in (`state`: the checkpoint's loader state, if any),
    for a prefetch while the model is built, probed and compiled."""
    train = manifest.split("train")
    usable = usable_shards(train, total_batch_tokens)
    start = train[state["shard"]] if state else (train[usable[0]] if usable else None)
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
