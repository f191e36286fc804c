"""Benchmark: tokens to a validation loss, Muon (train.optimizer=muon) against AdamW.

    python -m bench.optimizers                  # CPU: two small sizes, minutes
    python -m bench.optimizers --cuda --record  # GPU: up to GPT-2 124M, the figures to bench/results.jsonl

For each model size, AdamW and Muon train side by side in this process,
interleaved step by step on the same batches, each at a small sweep of peak
learning rates (`--lrs`, the same values for both: Muon's update is scaled to
AdamW's RMS, `match_rms_adamw`, so the lrs are comparable). Both use the
trainer's own pieces: the GPT model, gpt2.train.optim.make_optimizer,
train_step (gradient clipping, bf16 autocast on CUDA) and lr_at (linear warmup,
cosine decay). Each optimizer's best lr is the one with the lowest final
validation loss. Printed per size: AdamW's final validation loss, the tokens
Muon's best run needed to reach it (linear between evaluations; "not reached"
if it never did) and their ratio.

The data: the benchmarks' corpus (bench.corpus: prose of the installed
Python packages, built offline), tokenized with GPT-2's BPE, one document in
twenty held out as the validation set; training reads it in order, wrapping
around only when a run needs more tokens than it holds (said in the output).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench import records
from bench.corpus import build_corpus
from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.process.distributed import amp_dtype, distributed
from gpt2.report import figures_on_record
from gpt2.tokenizer import EOT_TOKEN, get_encoding
from gpt2.train.optim import lr_at, make_optimizer, set_lr
from gpt2.train.step import StepContext, evaluate, train_step


@dataclass(frozen=True)
class Size:
    name: str
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    micro_batch: int
    accum: int
    steps: int

    def model(self) -> ModelConfig:
        return ModelConfig(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, block_size=self.block_size)

    @property
    def step_tokens(self) -> int:
        return self.micro_batch * self.accum * self.block_size


# On a 2-core CPU a step of even the 3.3M model takes ~0.5 s (the 50,304-entry head dominates): the
# CPU sizes show the comparison runs, in minutes; the GPU sizes are the measurement.
CPU_SIZES = (Size("L2-C64", 2, 2, 64, 64, 8, 1, 60), Size("L4-C128", 4, 4, 128, 64, 8, 1, 60))
CUDA_SIZES = (Size("L6-C384", 6, 6, 384, 1024, 32, 2, 200), Size("gpt2-124m", 12, 12, 768, 1024, 32, 4, 200))


def tokens_of(corpus: Path, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) token arrays of the corpus; every 20th document is val."""
    texts = [json.loads(line)["text"] for line in corpus.open(encoding="utf-8")]
    docs = get_encoding("gpt2").encode_ordinary_batch(texts, num_threads=threads)
    split = ([], [])
    for i, doc in enumerate(docs):
        split[i % 20 == 0].append(np.array([EOT_TOKEN, *doc], dtype=np.int64))
    return np.concatenate(split[0]), np.concatenate(split[1])


@dataclass
class Run:
    optimizer: str
    lr: float
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    cfg: TrainConfig
    curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens, val loss)

    @property
    def final(self) -> float:
        return self.curve[-1][1]


def batches(tokens: np.ndarray, start: int, size: Size) -> list[tuple[torch.Tensor, torch.Tensor]]:
    n = size.micro_batch * size.block_size
    out = []
    for i in range(size.accum):
        at = (start + i * n) % (len(tokens) - n - 1)
        chunk = torch.from_numpy(tokens[at:at + n + 1])
        out.append((chunk[:-1].view(size.micro_batch, -1), chunk[1:].view(size.micro_batch, -1)))
    return out


def reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """Tokens at which `curve` first reaches `target` (linear between points)."""
    for (t0, l0), (t1, l1) in zip([(0, math.inf)] + curve, curve):
        if l1 <= target:
            return t1 if not math.isfinite(l0) else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return None


def train_size(size: Size, lrs: list[float], train: np.ndarray, val: np.ndarray, env, evals: int) -> list[Run]:
    device, amp = env.device, amp_dtype(env.device)
    ctx = StepContext(env, amp, 1.0)
    runs = []
    for optimizer in ("adamw", "muon"):
        for lr in lrs:
            torch.manual_seed(0)  # the same initial weights for every run
            model = GPT(size.model()).to(device)
            cfg = TrainConfig(optimizer=optimizer, lr=lr, max_steps=size.steps, warmup_steps=max(1, size.steps // 10),
                              min_lr_ratio=0.1, total_batch_tokens=size.step_tokens, micro_batch_size=size.micro_batch)
            runs.append(Run(optimizer, lr, model, make_optimizer(model, cfg, device.type), cfg))
    val_batches = [b for i in range(4) for b in batches(val, i * size.step_tokens, size)]
    every = max(1, size.steps // evals)
    t0 = time.perf_counter()
    for step in range(size.steps):
        data = batches(train, step * size.step_tokens, size)
        for run in runs:  # interleaved: machine noise and data hit every run alike
            set_lr(run.opt, lr_at(step, run.cfg))
            train_step(run.model, run.model, run.opt, data, ctx)
        if (step + 1) % every == 0 or step + 1 == size.steps:
            for run in runs:
                run.curve.append(((step + 1) * size.step_tokens, evaluate(run.model, val_batches, ctx)))
            print(f"  {size.name} step {step + 1}/{size.steps} ({time.perf_counter() - t0:.0f}s): "
                  + ", ".join(f"{r.optimizer}@{r.lr:g} {r.curve[-1][1]:.3f}" for r in runs), flush=True)
    return runs


def compare(size: Size, runs: list[Run], train_tokens: int) -> dict:
    best = {name: min((r for r in runs if r.optimizer == name), key=lambda r: r.final) for name in ("adamw", "muon")}
    target, total = best["adamw"].final, size.steps * size.step_tokens
    muon_tokens = reach(best["muon"].curve, target)
    return {
        "size": size.name, "params": sum(p.numel() for p in runs[0].model.parameters()),
        "tokens": total, "epochs": total / train_tokens,
        "adamw_lr": best["adamw"].lr, "muon_lr": best["muon"].lr,
        "adamw_final_val": target, "muon_final_val": best["muon"].final,
        "muon_tokens_to_adamw_final": muon_tokens,
        "muon_over_adamw_tokens": muon_tokens / total if muon_tokens is not None else None,
        "finals": {f"{r.optimizer}@{r.lr:g}": r.final for r in runs},
    }


def report(row: dict) -> None:
    reached = row["muon_tokens_to_adamw_final"]
    print(f"{row['size']} ({row['params'] / 1e6:.1f}M parameters, {row['tokens']:,} tokens, "
          f"{row['epochs']:.2f} epochs of the train split):")
    print(f"  AdamW (best lr {row['adamw_lr']:g}): final val loss {row['adamw_final_val']:.4f}")
    print(f"  Muon  (best lr {row['muon_lr']:g}): final val loss {row['muon_final_val']:.4f}; reached AdamW's final "
          + (f"at {reached:,.0f} tokens: ratio Muon/AdamW tokens {row['muon_over_adamw_tokens']:.3f}"
             if reached is not None else "never: not shown at this size"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="train on the GPU in bf16 (sizes up to GPT-2 124M)")
    parser.add_argument("--lrs", default=None, help="comma-separated peak lrs swept for both optimizers")
    parser.add_argument("--sizes", default=None, help="comma-separated size names to run (default: all)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: per size)")
    parser.add_argument("--evals", type=int, default=15, help="validation points per run")
    parser.add_argument("--corpus-mb", type=float, default=None, help="corpus size (default: 8 CPU, 120 GPU)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--record", action="store_true",
                        help=f"append the figures to {figures_on_record.RESULTS.name} (GPU)")
    args = parser.parse_args()
    if args.record and not args.cuda:
        parser.error(f"--record keeps GPU figures only ({figures_on_record.RESULTS.name}): add --cuda, "
                     "on a GPU machine")
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = CUDA_SIZES if args.cuda else CPU_SIZES
    if args.sizes:
        sizes = tuple(s for s in sizes if s.name in args.sizes.split(","))
    if args.steps:
        sizes = tuple(dataclasses.replace(s, steps=args.steps) for s in sizes)
    lrs = [float(x) for x in (args.lrs or ("1.5e-3,3e-3" if args.cuda else "3e-3,1e-2")).split(",")]
    with distributed("cuda" if args.cuda else "cpu") as env, tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp, "corpus.jsonl")
        t0 = time.perf_counter()
        try:
            build_corpus(corpus, args.corpus_mb or (120 if args.cuda else 8))
        except SystemExit as short:  # fewer packages installed: train on what there is (epochs say so)
            print(short)
        train, val = tokens_of(corpus, torch.get_num_threads())
        print(f"device {records.device_name(env.device)} | data: the bench corpus, {len(train):,} train and "
              f"{len(val):,} val tokens (GPT-2 BPE, {time.perf_counter() - t0:.0f}s) | lrs {lrs}", flush=True)
        for size in sizes:
            row = compare(size, train_size(size, lrs, train, val, env, args.evals), len(train))
            report(row)
            if args.record:  # each size as it ends: a later size cut short loses only itself
                device = records.device_name(env.device)
                rec = figures_on_record.figures_record("optimizers", device, torch.__version__, {
                    "what": "AdamW and Muon (train.optimizer) interleaved on the same batches, each at its best of "
                            "the swept peak lrs; tokens Muon's best run needs to reach AdamW's best final val loss",
                    "lrs": lrs, "train_tokens": len(train), **row})
                print(f"recorded in {figures_on_record.append(rec)}: {rec}", flush=True)


if __name__ == "__main__":
    main()
