"""Benchmark: what huge pages for large CPU tensors (gpt2.process.cpu_memory) save a CPU training step.

    python -m bench.cpu_memory                 # smoke preset's model and batch, 20 steps, 3 rounds
    python -m bench.cpu_memory --steps 30 --rounds 5

Each round starts two fresh processes one after the other, alternating which goes first: one as
`gpt2` sets it (THP_MEM_ALLOC_ENABLE=1), one with PyTorch's default (=0, the baseline, 4 KiB pages
faulted in one by one). Each builds the smoke preset's model
and AdamW and times its own CPU (user and system, os.times) over the same steps on the same
batches; the ratio of the medians is printed. One OpenMP thread, as the stacks' trainers run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from gpt2.process.cpu_memory import VARIABLE


def _child(steps: int) -> dict:
    import torch
    import torch.nn.functional as F

    from gpt2.config.overrides import resolve_config
    from gpt2.model import GPT
    config = resolve_config("smoke")
    torch.manual_seed(0)
    model = GPT(config.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr)
    micro, block = config.train.micro_batch_size, config.model.block_size
    accumulation = config.train.total_batch_tokens // (micro * block)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 50257, (micro, block + 1), generator=generator) for _ in range(4)]
    start = os.times()
    for step in range(steps):
        for k in range(accumulation):
            batch = batches[(step * accumulation + k) % len(batches)]
            logits = model(batch[:, :-1])
            logits = logits[0] if isinstance(logits, tuple) else logits
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
            (loss / accumulation).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    end = os.times()
    return {"user_s": end.user - start.user, "system_s": end.system - start.system}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.steps)))
        return
    results: dict[str, list[dict]] = {"huge": [], "plain": []}
    for round_ in range(args.rounds):
        for kind in (("huge", "plain") if round_ % 2 == 0 else ("plain", "huge")):
            env = {**os.environ, "OMP_NUM_THREADS": "1", VARIABLE: "1" if kind == "huge" else "0"}
            done = subprocess.run([sys.executable, "-m", "bench.cpu_memory", "--child", "--steps", str(args.steps)],
                                  env=env, capture_output=True, text=True, check=True)
            results[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.steps} smoke steps a process, {args.rounds} rounds, median CPU seconds:")
    for kind, label in (("plain", "4 KiB pages (baseline)"), ("huge", "huge pages (gpt2's)")):
        user = statistics.median(r["user_s"] for r in results[kind])
        system = statistics.median(r["system_s"] for r in results[kind])
        print(f"  {label:27s} user {user:6.2f}  system {system:6.2f}  total {user + system:6.2f}")
    total = {k: statistics.median(r["user_s"] + r["system_s"] for r in v) for k, v in results.items()}
    print(f"  ratio huge/baseline (total CPU): {total['huge'] / total['plain']:.2f}")


if __name__ == "__main__":
    main()
