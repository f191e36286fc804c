"""The preflight's collectives check: every rank answers a roll call before
the process group is formed (so a rank that never comes is named, not waited
for until a timeout that names nobody), then an all-reduce over every rank
gives the bus bandwidth (NCCL on GPUs, gloo on CPU)."""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist

from gpt2.preflight.report import Failed, Outcome
from gpt2.process.distributed import DistEnv

PREFIX = "gpt2-preflight/"
ALL_REDUCE_BYTES = {"cuda": 256 << 20, "cpu": 16 << 20}
"""The all-reduce's payload: large enough to measure bandwidth, not latency."""


def roll_call_store(timeout_s: float) -> dist.Store:
    """The store of torchrun's environment (MASTER_ADDR/PORT): the agent's
    under torchrun; else rank 0 hosts it, without waiting for the others
    (torch's own env:// rendezvous would wait there for every rank, naming none)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"])
    timeout = datetime.timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    return dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False,
                         multi_tenant=True)


def roll_call(store: dist.Store, rank: int, world: int, timeout_s: float) -> list[int]:
    """Every rank says it is here; rank 0 waits up to `timeout_s` for all and
    posts the verdict, which the others wait for. Returns the missing ranks."""
    store.set(f"{PREFIX}here/{rank}", socket.gethostname())
    if rank == 0:
        keys = [f"{PREFIX}here/{r}" for r in range(world)]
        deadline = time.monotonic() + timeout_s
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.2)
        missing = [r for r in range(world) if not store.check([f"{PREFIX}here/{r}"])]
        store.set(f"{PREFIX}verdict", ",".join(map(str, missing)) or "all")
        return missing
    store.wait([f"{PREFIX}verdict"], datetime.timedelta(seconds=timeout_s + 60))
    verdict = store.get(f"{PREFIX}verdict").decode()
    return [] if verdict == "all" else [int(r) for r in verdict.split(",")]


def missing_ranks(missing: list[int], world: int, timeout_s: float) -> Failed:
    return Failed(f"rank(s) {', '.join(map(str, missing))} of {world} did not join within {timeout_s:.0f} s: check "
                  "that every node was started with the same --nnodes/--nproc_per_node and rendezvous endpoint, and "
                  "the failed rank's own log", missing_ranks=missing)


def all_reduce_check(env: DistEnv, repeats: int = 5) -> Outcome:
    """Bus bandwidth of an all-reduce over every rank (the nccl-tests
    convention: bytes x 2(n-1)/n over the time), its median of `repeats`."""
    backend = dist.get_backend()
    nbytes = ALL_REDUCE_BYTES["cuda" if env.device.type == "cuda" else "cpu"]
    device = env.device if backend == "nccl" else torch.device("cpu")
    t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dist.all_reduce(t)  # warm-up: the communicators are built on the first one
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    expected = float(env.world_size) ** (repeats + 1)  # ones, summed repeats + 1 times over world ranks
    if t[0].item() != expected:
        raise Failed(f"the {backend} all-reduce over {env.world_size} ranks gave {t[0].item()}, not {expected}: "
                     "the interconnect corrupts data")
    times.sort()
    seconds = times[len(times) // 2]
    bus = nbytes * 2 * (env.world_size - 1) / env.world_size / seconds
    return Outcome(f"{backend} all-reduce of {nbytes >> 20} MiB over {env.world_size} ranks: {seconds * 1e3:.1f} ms, "
                   f"bus bandwidth {bus / 1e9:.2f} GB/s", {"all_reduce_bus_bytes_per_s": bus, "backend": backend})
