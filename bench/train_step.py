"""Benchmark: our training step against a plain nanoGPT-style loop, and what
checkpointing and MLflow logging cost relative to a step.

    python -m bench.train_step                 # CPU: a small GPT, fp32
    python -m bench.train_step --cuda          # GPU: GPT-2 124M, bf16, eager vs compiled, MFU

It also reports what runtime.recompute costs: our eager step with per-block
recomputation against the same step without it.

The reference is written here on purpose: a straightforward GPT module and an
AdamW loop (same dims, batch, dtype, attention kernel), the baseline every
number is a ratio against. Both run in this process, interleaved, so machine
noise hits them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2 import layout
from gpt2.checkpoint.writer import CheckpointWriter
from gpt2.config import ModelConfig, TrainConfig
from gpt2.model import GPT
from gpt2.overrides import resolve_config
from gpt2.tracking import Tracker
from gpt2.train.distributed import DistEnv, amp_dtype, autocast
from gpt2.train.optim import make_optimizer
from gpt2.train.step import StepContext, find_micro_batch, train_step
from gpt2.train.throughput import mfu, peak_flops, synchronize


class RefBlock(nn.Module):
    def __init__(self, C: int, H: int):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class RefGPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(RefBlock(cfg.n_embd, cfg.n_head) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def ref_step(model, opt, batches, device, dtype):
    opt.zero_grad(set_to_none=True)
    for x, y in batches:
        with autocast(device, dtype):
            loss = model(x, y) / len(batches)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def timed(fn, device, clock=time.perf_counter) -> float:
    synchronize(device)
    t0 = clock()
    fn()
    synchronize(device)
    return clock() - t0


def auto_batch(cfg: ModelConfig, device: torch.device) -> int:
    """The micro-batch `train.micro_batch_size=auto` picks for gpt2-124m's
    512 sequences a step, probed eagerly as the trainer does."""
    model = GPT(cfg).to(device)
    ctx = StepContext(DistEnv(0, 0, 1, device), amp_dtype(device), 1.0)
    return find_micro_batch(model, lambda: make_optimizer(model, TrainConfig(), device.type),
                            TrainConfig().total_batch_tokens // cfg.block_size, cfg.block_size, cfg.vocab_size, ctx)


def measure_steps(args, cfg: ModelConfig, device: torch.device, compile: bool) -> dict:
    dtype = amp_dtype(device)
    torch.manual_seed(0)
    ours = GPT(cfg).to(device)
    ref = RefGPT(cfg).to(device)
    tcfg = TrainConfig()
    our_opt = make_optimizer(ours, tcfg, device.type)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=6e-4, betas=(0.9, 0.95), fused=device.type == "cuda")
    raw = ours
    if compile:
        ours, ref = torch.compile(ours), torch.compile(ref)
    ctx = StepContext(DistEnv(0, 0, 1, device), dtype, 1.0)
    batches = [(torch.randint(0, 50257, (args.batch, cfg.block_size), device=device),) * 2
               for _ in range(args.accum)]
    run_ours = lambda: train_step(ours, raw, our_opt, batches, ctx)  # noqa: E731
    run_ref = lambda: ref_step(ref, ref_opt, batches, device, dtype)  # noqa: E731
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        run_ours(), run_ref()
    synchronize(device)
    warmup_s = time.perf_counter() - t0
    # On a CPU shared with other work, wall time measures the neighbours too:
    # single-threaded steps timed in process CPU time measure our own work.
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    t_ours, t_ref = [], []
    for _ in range(args.steps):  # interleaved: background load hits both alike
        t_ours.append(timed(run_ours, device, clock))
        t_ref.append(timed(run_ref, device, clock))
    # The fastest of several steps: interference only ever adds time.
    return {"ours": min(t_ours), "ref": min(t_ref), "model": raw, "opt": our_opt, "warmup_s": warmup_s,
            "ours_median": statistics.median(t_ours), "ref_median": statistics.median(t_ref)}


def report_recompute(r: dict, args, cfg: ModelConfig, device: torch.device) -> None:
    """Our eager step with and without per-block recomputation, interleaved,
    on the same model and batches (the baseline is the step without it)."""
    model, opt = r["model"], r["opt"]
    ctx = StepContext(DistEnv(0, 0, 1, device), amp_dtype(device), 1.0)
    batches = [(torch.randint(0, 50257, (args.batch, cfg.block_size), device=device),) * 2
               for _ in range(args.accum)]
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    times = {False: [], True: []}
    for _ in range(args.steps):
        for on in (False, True):
            model.recompute = on
            times[on].append(timed(lambda: train_step(model, model, opt, batches, ctx), device, clock))
    model.recompute = False
    print(f"recompute (runtime.recompute, eager): step time with/without {min(times[True]) / min(times[False]):.3f}x "
          f"best, {statistics.median(times[True]) / statistics.median(times[False]):.3f}x median")


def measure_checkpoint(model, opt, root: Path) -> dict:
    """What a checkpoint costs: the training thread is held for the snapshot;
    serializing, hashing and writing happen on the writer thread."""
    config = resolve_config("smoke", {}, root=str(root))
    state = {"step": 1, "config": config.model_dump(mode="json")}
    writer = CheckpointWriter(str(root), keep=1)
    held, total = [], []
    for step in range(1, 4):
        t0 = time.perf_counter()
        held.append(writer.submit(layout.checkpoint_dir(str(root), step), model, opt, {**state, "step": step}, {}))
        writer.wait()
        total.append(time.perf_counter() - t0)
    writer.close()
    return {"held_s": statistics.median(held), "save_s": statistics.median(total)}


def measure_logging(root: Path) -> dict:
    config = resolve_config("smoke", {"tracking.uri": f"sqlite:///{root}/mlflow.db"}, root=str(root))
    with Tracker(config, "bench") as tracker:
        n = 200
        t0 = time.perf_counter()
        for i in range(n):
            tracker.log_metrics({"train/loss": 3.0, "train/lr": 6e-4, "train/grad_norm": 1.0,
                                 "perf/tokens_per_second": 1e6, "perf/mfu": 0.5}, step=i)
        log_s = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        tracker.flush()
        send_s = (time.perf_counter() - t0) / n
    return {"log_s": log_s, "send_s": send_s}


def report_steps(r: dict, tokens: int, device: torch.device, label: str) -> None:
    for name, key in (("reference", "ref"), ("ours", "ours")):
        print(f"{label}{name:>9}: {tokens / r[key]:,.0f} tok/s (best {1000 * r[key]:.1f} ms/step, "
              f"median {1000 * r[key + '_median']:.1f} ms)")
    print(f"{label}ratio ours/reference (tokens/s): {r['ref'] / r['ours']:.3f}x best, "
          f"{r['ref_median'] / r['ours_median']:.3f}x median; warm-up (compilation) {r['warmup_s']:.1f}s")
    util = mfu(r["model"].flops_per_token(), tokens / r["ours"], peak_flops(device))
    if util is not None:
        print(f"{label}MFU (model FLOPs 6N + attention, dense bf16 peak): {100 * util:.1f}%")


def report_overheads(r: dict) -> None:
    step = r["ours"]
    with tempfile.TemporaryDirectory() as tmp:
        o = measure_checkpoint(r["model"], r["opt"], Path(tmp))
    print(f"checkpoint: training thread held {o['held_s']:.3f}s = {o['held_s'] / step:.3f} steps "
          f"(whole write in the background: {o['save_s']:.3f}s); amortized over checkpoint_every=500 "
          f"(gpt2-124m): {100 * o['held_s'] / (500 * step):.4f}% of step time, over 10 (smoke): "
          f"{100 * o['held_s'] / (10 * step):.3f}%")
    if importlib.util.find_spec("mlflow") is None:
        print("MLflow overheads skipped: mlflow is not installed here")
        return
    with tempfile.TemporaryDirectory() as tmp:
        o = measure_logging(Path(tmp))
    print(f"MLflow log_metrics (5 metrics, on the training thread): {1e6 * o['log_s']:.1f} us/step "
          f"= {100 * o['log_s'] / step:.4f}% of step time")
    print(f"MLflow background send (SQLite, off the training thread): {1e3 * o['send_s']:.2f} ms/step "
          f"= {100 * o['send_s'] / step:.3f}% of step time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="GPT-2 124M on the GPU in bf16, eager and compiled")
    parser.add_argument("--compile", action="store_true", help="CPU mode: torch.compile both models")
    parser.add_argument("--batch", default=None, help="micro-batch (CUDA default: auto, as the trainer picks it)")
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: CPU-time measurements are exact)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.cuda:
        device, cfg = torch.device("cuda"), ModelConfig()
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        args.batch = auto_batch(cfg, device) if args.batch in (None, "auto") else int(args.batch)
        torch.cuda.empty_cache()  # the probe's model is gone; hand its blocks back
        modes = (False, True)
    else:
        device, cfg = torch.device("cpu"), ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=128)
        args.batch = int(args.batch or 4)
        modes = (args.compile,)
    tokens = args.batch * args.accum * cfg.block_size
    clock = "CPU time, 1 thread" if device.type == "cpu" and args.threads == 1 else "wall time"
    print(f"device {device} | model L{cfg.n_layer} H{cfg.n_head} C{cfg.n_embd} T{cfg.block_size} "
          f"| micro-batch {args.batch} x {args.accum} | {tokens} tokens/step | dtype "
          f"{amp_dtype(device) or torch.float32} | {clock}")
    results = {}
    for compile in modes:
        label = "compiled " if compile else ("eager " if args.cuda else "")
        results[compile] = measure_steps(args, cfg, device, compile)
        report_steps(results[compile], tokens, device, label)
    if len(results) == 2:
        print(f"ratio compiled/eager (ours, tokens/s): {results[False]['ours'] / results[True]['ours']:.3f}x best")
    report_recompute(results[modes[0]], args, cfg, device)
    report_overheads(results[modes[-1]])


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
