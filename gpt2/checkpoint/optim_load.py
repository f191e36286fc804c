"""This rank's part of a checkpoint's optimizer state, read without the rest.

A resume must not cost more memory than training does: a ZeRO-1 run on 8
ranks keeps an eighth of the optimizer state per rank, and a resume that gave
every rank every share (and merged them) would hold the whole state eight
times over on one machine, an out-of-memory error after the run was paid for.
So, after rank 0 has picked and verified the checkpoint:

- ZeRO-1 on as many ranks as wrote it: each rank reads its own share file from
  the root (verified against the marker), which is exactly the state it keeps;
- otherwise (another rank count, another layout, a replicated optimizer):
  rank 0 reads the shares one at a time and sends each to every rank, which
  keeps the entries of the parameters whose state it keeps (a replicated
  optimizer: all) and drops the rest before the next arrives.

Either way a rank holds at most one share beyond the state it keeps.
"""

from __future__ import annotations

import io

import torch

from gpt2.checkpoint import shares, store
from gpt2.checkpoint.optim_share import is_sharded
from gpt2.process.distributed import DistEnv, any_rank, broadcast_bytes


def owned_indices(optimizer: torch.optim.Optimizer) -> set[int]:
    """The global indices (a plain optimizer's over the whole model) of the
    parameters whose state this rank keeps."""
    if is_sharded(optimizer):
        index = optimizer._param_to_index  # ZeRO's own mapping
        return {index[p] for group in optimizer.optim.param_groups for p in group["params"]}
    return set(range(sum(len(group["params"]) for group in optimizer.param_groups)))


def _decode(blob: bytes) -> dict:
    # BytesIO shares a bytes object's buffer: no second copy of the share.
    return torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")


def rank_state(url: str, entries: dict[str, dict], optimizer: torch.optim.Optimizer, env: DistEnv) -> dict:
    """The optimizer state_dict this rank loads: every parameter group, the
    state of the parameters it keeps. A collective: every rank calls it."""
    names = shares.optimizer_files(entries)
    if names is None:
        raise store.CheckpointError(f"checkpoint {url} has no whole set of optimizer files among {sorted(entries)}")
    owned = owned_indices(optimizer)
    if is_sharded(optimizer) and len(names) == env.world_size:
        mine = _decode(store.read_verified(url, names[env.rank], entries[names[env.rank]]))
        # Every rank takes the same path: shares written by a replicated
        # optimizer are split by size, not by ZeRO's owners.
        if not any_rank(set(mine["state"]) != owned, env):
            return mine
        del mine
    state, groups = {}, None
    for name in names:
        part = _decode(broadcast_bytes(store.read_verified(url, name, entries[name]) if env.is_main else None, env))
        if groups is not None and part["param_groups"] != groups:
            raise store.CheckpointError(f"checkpoint {url}: {name} has other parameter groups than {names[0]}")
        groups = part["param_groups"]
        state.update({i: s for i, s in part["state"].items() if i in owned})
    return {"state": state, "param_groups": groups}
