"""The optimizer state of a checkpoint, stored as one file per rank.

Every rank of a run writes its own share of the AdamW state, in parallel, so
a save costs the same whatever the number of ranks and nothing gathers the
full state on one rank. A share is an ordinary optimizer `state_dict` (the
indices and groups of a plain AdamW's) holding the state of some of the
parameters; the shares of one checkpoint cover every parameter exactly once,
and merged they are the state_dict a plain AdamW would have saved, so any run
resumes under any number of ranks, ZeRO-1 or not.

    optimizer.pt                    one process: the whole state (the format of
                                    checkpoints written before shares existed)
    optimizer-00000-of-00008.pt     rank 0's share of a run on 8 ranks
    ...
    optimizer-00007-of-00008.pt

Which parameters a rank stores: with ZeRO-1 the ones whose state it keeps
anyway (gpt2.checkpoint.optim_share); with a replicated AdamW a partition balanced
by size, so the work is split just the same.
"""

from __future__ import annotations

import re

WHOLE = "optimizer.pt"
_SHARE = re.compile(r"^optimizer-(\d{5})-of-(\d{5})\.pt$")


def share_name(rank: int, world_size: int) -> str:
    """The file holding `rank`'s share (the whole state for one process)."""
    return WHOLE if world_size == 1 else f"optimizer-{rank:05d}-of-{world_size:05d}.pt"


def is_optimizer_file(name: str) -> bool:
    return name == WHOLE or _SHARE.match(name) is not None


def optimizer_files(names) -> list[str] | None:
    """The optimizer files among a checkpoint's file names, in rank order;
    None unless they are exactly `optimizer.pt` or every share of one rank
    count (a checkpoint missing a share is incomplete, not smaller)."""
    found = sorted(n for n in names if is_optimizer_file(n))
    if found == [WHOLE]:
        return found
    matches = [_SHARE.match(n) for n in found]
    if not matches or WHOLE in found:
        return None
    count = int(matches[0].group(2))
    return found if found == [share_name(r, count) for r in range(count)] and count > 1 else None


def partition(sizes: list[int], world_size: int) -> list[int]:
    """The rank storing each parameter's state (by index): largest first, each
    to the least loaded rank, so every rank writes about the same bytes."""
    loads, owner = [0] * world_size, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        owner[i], loads[rank] = rank, loads[rank] + sizes[i]
    return owner


def merge(shares: list[dict], names: list[str] | None = None) -> dict:
    """The whole optimizer state_dict from its shares; a parameter stored
    twice or groups that differ mean shares of different saves were mixed."""
    names = names or [str(i) for i in range(len(shares))]
    state: dict = {}
    for name, share in zip(names, shares):
        if share["param_groups"] != shares[0]["param_groups"]:
            raise ValueError(f"{name} has other parameter groups than {names[0]}: shares of different saves")
        twice = state.keys() & share["state"].keys()
        if twice:
            raise ValueError(f"{name} repeats the state of parameter(s) {sorted(twice)[:5]}: shares of different saves")
        state.update(share["state"])
    return {"state": state, "param_groups": shares[0]["param_groups"]}
