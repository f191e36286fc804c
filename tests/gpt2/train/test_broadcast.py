"""Resume on several ranks: rank 0 reads the checkpoint once and sends its
bytes; the others decode exactly what rank 0 verified."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt2.process.distributed import DistEnv, broadcast_bytes
from tests.tiers import SCENARIO

# Ranks spawned from the warm interpreter (tests/warm_python): gloo and the code under test unchanged.
pytestmark = [*SCENARIO, pytest.mark.usefixtures("warm_spawn")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, payloads: list[bytes], out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        env = DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"))
        got = [broadcast_bytes(p if rank == 0 else None, env) for p in payloads]
        out.put((rank, got))
    finally:
        dist.destroy_process_group()


def test_rank_zeros_bytes_reach_every_rank_unchanged():
    payloads = [b"", os.urandom(1), os.urandom(3 << 20), b"state.json {}"]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 3, port, payloads, out)) for r in range(3)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results == {r: payloads for r in range(3)}
