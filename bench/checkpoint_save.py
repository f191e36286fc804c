"""Checkpoint save time per number of ranks: the earlier way (ZeRO-1's
`consolidate_state_dict` sends every rank's optimizer shard to rank 0, which
then writes the whole checkpoint alone) against per-rank shares (every rank
writes its own share at the same time, rank 0 commits the marker;
gpt2.checkpoint.writer), both measured in this run on the same model.

    python -m bench.checkpoint_save                                  # 1, 2, 4 gloo processes, small model
    python -m bench.checkpoint_save --ranks 1 2 4 8 --n-layer 12 --n-embd 768 --repeat 5

Each rank count starts that many gloo processes on the CPU (the nearest real
path to NCCL here) with a ZeRO-1 AdamW that has taken one step. A save is
timed on rank 0 from its start until the checkpoint's COMPLETE marker is
written (`save`), and for the part the training thread is held (`held`:
gathering and copying to the CPU); the best of --repeat saves counts. The
ratio is earlier ÷ shares: above 1, the per-rank way saves faster. On a
machine with fewer cores than ranks the ranks share the cores, so the
parallel writes gain less than they do on one core (or GPU and NIC) each.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt2.checkpoint import shares, store
from gpt2.checkpoint.optim_share import is_sharded, state_share
from gpt2.checkpoint.writer import CheckpointWriter
from gpt2.config.presets import PRESETS
from gpt2.config.sections import ModelConfig
from gpt2.model import GPT
from gpt2.root import layout
from gpt2.train.optim import make_optimizer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trained(args: argparse.Namespace) -> tuple[GPT, torch.optim.Optimizer]:
    """The model and a ZeRO-1 AdamW (plain on one rank) with its state created by one step."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=64))
    opt = make_optimizer(model, PRESETS["smoke"]().train, "cpu", shard=True)
    batch = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(0))
    model(batch, batch)[1].backward()
    opt.step()
    return model, opt


def _save_gathered(model, opt, url: str, state: dict, rank: int) -> float:
    """The earlier save: gather on rank 0, snapshot there, write there. Returns the seconds held."""
    t0 = time.perf_counter()
    if is_sharded(opt):
        opt.consolidate_state_dict(to=0)  # world-size rounds on every rank
    if rank != 0:
        return time.perf_counter() - t0
    tensors, whole = store.snapshot(model, opt)
    held = time.perf_counter() - t0
    store.write_checkpoint(url, tensors, whole, state, {"cpu": torch.get_rng_state()})
    return held


def _rank(rank: int, world: int, port: int, root: str, args: argparse.Namespace, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, opt = _trained(args)
        writer = CheckpointWriter(os.path.join(root, "shares"), keep=1)
        times: dict[str, list[tuple[float, float]]] = {"gathered": [], "shares": []}
        for step in range(1, args.repeat + 1):
            state = {"step": step}
            for way in times:
                url = layout.checkpoint_dir(os.path.join(root, way), step)
                dist.barrier()
                t0 = time.perf_counter()
                if way == "gathered":
                    held = _save_gathered(model, opt, url, state, rank)
                else:
                    held = writer.submit(url, model, opt, state, {"cpu": torch.get_rng_state()})
                    writer.wait()
                times[way].append((time.perf_counter() - t0, held))
                dist.barrier()
                if rank == 0:
                    store.prune(os.path.join(root, way), keep=1)
        writer.close()
        share_bytes = len(store.encode_optimizer(state_share(opt, rank, world)))
        out.put((rank, times, share_bytes))
    finally:
        dist.destroy_process_group()


def measure(world: int, args: argparse.Namespace) -> dict:
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), _free_port()
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        procs = [ctx.Process(target=_rank, args=(r, world, port, root, args, out)) for r in range(world)]
        for p in procs:
            p.start()
        results = {rank: (times, nbytes) for rank, times, nbytes in (out.get(timeout=1800) for _ in procs)}
        for p in procs:
            p.join(timeout=120)
            if p.exitcode != 0:
                raise SystemExit(f"rank process exited with {p.exitcode}")
    times = results[0][0]
    best = {way: min(t) for way, t in times.items()}  # (save_s, held_s) of the fastest save
    return {"ranks": world, **{f"{w}_save_s": s for w, (s, _) in best.items()},
            **{f"{w}_held_s": h for w, (_, h) in best.items()},
            "largest_share_mb": max(n for _, n in results.values()) / 2**20,
            "whole_state_mb": sum(n for _, n in results.values()) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="saves per way; the fastest counts")
    parser.add_argument("--dir", default=None, help="where the checkpoints are written (default: the temp dir)")
    args = parser.parse_args()
    params = sum(p.numel() for p in GPT(ModelConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                                                    block_size=64)).parameters())
    print(f"checkpoint save, {params / 1e6:.1f}M parameters, torch {torch.__version__}, "
          f"{os.cpu_count()} CPU cores, best of {args.repeat}; optimizer files: "
          f"{shares.share_name(0, 1)} or {shares.share_name(0, 2)}, ...")
    first = None
    for world in args.ranks:
        r = measure(world, args)
        first = first or r
        print(f"ranks {world}: gathered on rank 0 {r['gathered_save_s']:.2f} s (held {r['gathered_held_s']:.2f} s) | "
              f"per-rank shares {r['shares_save_s']:.2f} s (held {r['shares_held_s']:.2f} s) | "
              f"gathered/shares {r['gathered_save_s'] / r['shares_save_s']:.2f}x save, "
              f"{r['gathered_held_s'] / r['shares_held_s']:.2f}x held | largest optimizer file "
              f"{r['largest_share_mb']:.0f} of {r['whole_state_mb']:.0f} MB | shares save vs 1 rank "
              f"{r['shares_save_s'] / first['shares_save_s']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
