"""This rank's share of the optimizer state, as a checkpoint stores it.

A share is a plain AdamW `state_dict` restricted to some parameters: the
global indices and groups of an unsharded AdamW over the whole model
(gpt2.checkpoint.shares merges the shares back). Taking it needs no
collective: with ZeRO-1 a rank stores the state it keeps; with a replicated
AdamW every rank holds all of it and stores the part
`gpt2.checkpoint.shares.partition` gives it.
"""

from __future__ import annotations

import sys

import torch

from gpt2.checkpoint.shares import partition


def is_sharded(optimizer: torch.optim.Optimizer) -> bool:
    """A ZeRO-1 optimizer (none can exist before torch.distributed.optim is imported)."""
    zero = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    return zero is not None and isinstance(optimizer, zero.ZeroRedundancyOptimizer)


def state_share(optimizer: torch.optim.Optimizer, rank: int, world_size: int) -> dict:
    """The state of the parameters `rank` stores (references to the live
    tensors: copy them before the next step changes them)."""
    if is_sharded(optimizer):
        return _zero_share(optimizer, rank)
    full = optimizer.state_dict()
    if world_size == 1:
        return full
    params = [p for g in optimizer.param_groups for p in g["params"]]
    owner = partition([p.numel() for p in params], world_size)
    return {"state": {i: s for i, s in full["state"].items() if owner[i] == rank},
            "param_groups": full["param_groups"]}


def _zero_share(optimizer, rank: int) -> dict:
    """ZeRO-1: the local AdamW's state under the global indices, and the
    groups a plain AdamW would save (ZeRO's keys over the local AdamW's, as
    ShardedAdamW.state_dict syncs them)."""
    index = optimizer._param_to_index  # global index of every parameter (ZeRO's own mapping)
    state = {index[p]: s for p, s in optimizer.optim.state.items()}
    assert all(optimizer._param_to_rank[p] == rank for p in optimizer.optim.state), "ZeRO state of another rank"
    groups = [{**{k: v for k, v in local.items() if k != "params"},
               **{k: v for k, v in group.items() if k != "params"},
               "params": [index[p] for p in group["params"]]}
              for local, group in zip(optimizer.optim.param_groups, optimizer.param_groups)]
    return {"state": state, "param_groups": groups}
