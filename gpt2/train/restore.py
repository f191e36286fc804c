"""Reading a checkpoint back into a training session: rank 0's checkpoint
shared with every rank, its state folded with the rollbacks recorded beside
it (gpt2.train.rollback); the RNG states a checkpoint keeps. Putting one back
into a running session (a rollback) is gpt2.train.spike_actions.restore."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gpt2.checkpoint import store
from gpt2.process.distributed import DistEnv, broadcast_bytes, control_group
from gpt2.train import rollback


def shared_checkpoint(ckpt: store.Checkpoint | None, error: Exception | None,
                      env: DistEnv) -> store.Checkpoint | None:
    """Rank 0's checkpoint (read and verified there) on every rank, its state
    folded with the rollbacks recorded beside it (gpt2.train.rollback); rank
    0's error raised on every rank. A collective."""
    records = []
    if env.is_main and ckpt is not None and error is None:
        try:
            records = rollback.read_records(ckpt.url)
        except Exception as err:  # noqa: BLE001 - every rank must hear of it
            error = store.CheckpointError(f"the rollback records of {ckpt.url} cannot be read: {err}")
    if env.is_distributed:
        # The file names too: a checkpoint written on several ranks has one optimizer share per rank.
        box = [ckpt.url if ckpt else None, str(error) if error else None, sorted(ckpt.files) if ckpt else None,
               ckpt.entries if ckpt else None, records]
        dist.broadcast_object_list(box, src=0, group=control_group())  # waits for rank 0's read: long timeout
        if box[1] and error is None:
            error = store.CheckpointError(box[1])
        if box[0] and not box[1]:
            files = {name: broadcast_bytes(ckpt.files[name] if env.is_main else None, env) for name in box[2]}
            if not env.is_main:
                ckpt = store.decode_checkpoint(box[0], files, box[3])
        records = box[4]
    if error is not None:
        raise error
    if ckpt is not None:
        ckpt.files = None  # decoded and sent: no second copy in memory
        ckpt.state = rollback.folded(ckpt.state, records)
    return ckpt


def restore_rng(rng: dict, device: torch.device) -> None:
    if "cpu" in rng:
        torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)


def rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state
