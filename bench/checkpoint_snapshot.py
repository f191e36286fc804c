"""Benchmark: how long a checkpoint holds the training thread, the snapshot of
the weights and the AdamW state to host memory that the background writer
then serializes (gpt2.checkpoint.writer.CheckpointWriter.submit).

    python -m bench.checkpoint_snapshot --cuda     # GPT-2 124M and its AdamW state on the GPU
    python -m bench.checkpoint_snapshot            # CPU: a small GPT (both paths copy alike there)

The baseline, written here on purpose, is the snapshot before pinned copies:
one blocking `.to("cpu", copy=True)` per tensor into fresh pageable memory.
Both run in this process, interleaved, `--rounds` times each; the first round
of each is reported apart (the pinned blocks are allocated then, and reused
from torch's host cache afterwards, as at every later checkpoint of a run).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gpt2.checkpoint.optim_share import state_share
from gpt2.checkpoint.store import host_copy
from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.train.optim import make_optimizer
from gpt2.train.throughput import synchronize


def pageable_copy(obj):
    """The code before: a blocking device-to-host copy per tensor."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True).contiguous()
    if isinstance(obj, dict):
        return {k: pageable_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(pageable_copy(v) for v in obj)
    return obj


def held(copy, model, opt, device) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    copy(model.state_dict()), copy(state_share(opt, 0, 1))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="GPT-2 124M on the GPU")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda" if args.cuda else "cpu")
    cfg = ModelConfig() if args.cuda else ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=128)
    model = GPT(cfg).to(device)
    opt = make_optimizer(model, TrainConfig(), device.type)
    x = torch.randint(0, 50257, (2, cfg.block_size), device=device)
    model(x, x, return_logits=False)[1].backward()
    opt.step()  # AdamW's moments exist, as at any checkpoint
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                  if isinstance(t, torch.Tensor))
    times = {"pageable (before)": [], "pinned, one sync (now)": []}
    for _ in range(args.rounds):
        for (name, copy) in zip(times, (pageable_copy, host_copy)):
            times[name].append(held(copy, model, opt, device))
    print(f"device {device} | {nbytes / 1e9:.2f} GB of weights and AdamW state | {args.rounds} rounds, interleaved")
    for name, t in times.items():
        rest = t[1:] or t
        print(f"{name:>24}: first {t[0]:.3f}s, then median {statistics.median(rest):.3f}s "
              f"[{min(rest):.3f}-{max(rest):.3f}] = {nbytes / statistics.median(rest) / 1e9:.1f} GB/s")
    before, now = (statistics.median(t[1:] or t) for t in times.values())
    print(f"ratio held before/now: {before / now:.2f}x (median after the first round)")


if __name__ == "__main__":
    main()
