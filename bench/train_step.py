"""Benchmark: our training step against a plain nanoGPT-style loop, and what
checkpointing and MLflow logging cost relative to a step.

    python -m bench.train_step                    # CPU: a small GPT, fp32
    python -m bench.train_step --cuda             # GPU: GPT-2 124M, bf16, eager vs compiled, MFU
    python -m bench.train_step --cuda --record    # ... and the figures appended to bench/results.jsonl
    torchrun --standalone --nproc_per_node=8 -m bench.train_step --cuda --record   # DDP and ZeRO-1

Every timed iteration is a whole one, the window nanoGPT and llm.c time and
the trainer's tokens/s uses: the batch fetch through the trainer's data path
(bench.step_data), the copy to the device, forward, backward, optimizer step.

It also reports what runtime.recompute costs: our eager step with per-block
recomputation against the same step without it.

Under torchrun (several processes; NCCL on GPUs, gloo on CPU) it times the
trainer's multi-GPU setups instead, interleaved: DDP with plain AdamW, and
DDP with ZeRO-1 (runtime.shard_optimizer), both as gpt2.train.parallel and
gpt2.train.optim build them. Tokens/s are global, MFU per GPU; `--record`
keeps the DDP row.

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
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench import records
from bench.step_data import synthetic_loader
from gpt2.checkpoint.writer import CheckpointWriter
from gpt2.config.overrides import resolve_config
from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv, amp_dtype, autocast, distributed
from gpt2.report import figures_on_record
from gpt2.root import layout
from gpt2.tracking.tracker import Tracker
from gpt2.train.optim import make_optimizer
from gpt2.train.parallel import wrap_ddp
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
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
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


def auto_batch(cfg: ModelConfig, env: DistEnv) -> int:
    """The micro-batch `train.micro_batch_size=auto` picks for gpt2-124m's
    512 sequences a step over this many ranks, probed eagerly as the trainer
    does (in a step's steady-state memory, with DDP's buckets under torchrun)."""
    model = GPT(cfg).to(env.device)
    ctx = StepContext(env, amp_dtype(env.device), 1.0)
    seqs_per_rank = TrainConfig().total_batch_tokens // (cfg.block_size * env.world_size)
    return int(find_micro_batch(model, lambda shard=False: make_optimizer(model, TrainConfig(), env.device_type, shard),
                                seqs_per_rank, cfg.block_size, cfg.vocab_size, ctx))


Runs = dict[str, Callable[[], object]]


def _iteration(model, raw, opt, loader, ctx) -> Callable[[], object]:
    """One whole training iteration: fetch this rank's batches, then the step."""
    return lambda: train_step(model, raw, opt, loader.next_batches(), ctx)


def single_runs(args, cfg: ModelConfig, env: DistEnv, compile: bool, data: Path) -> tuple[Runs, GPT, object]:
    """Ours and the reference, one process; (runs, our model, our optimizer)."""
    device, dtype = env.device, amp_dtype(env.device)
    torch.manual_seed(0)
    ours = GPT(cfg).to(device)
    ref = RefGPT(cfg).to(device)
    our_opt = make_optimizer(ours, TrainConfig(), device.type)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=6e-4, betas=(0.9, 0.95), fused=device.type == "cuda")
    raw = ours
    if compile:
        ours, ref = torch.compile(ours), torch.compile(ref)
    ours_data, ref_data = (synthetic_loader(data, cfg.block_size, args.batch, args.accum, env) for _ in range(2))
    runs = {"ours": _iteration(ours, raw, our_opt, ours_data, StepContext(env, dtype, 1.0)),
            "reference": lambda: ref_step(ref, ref_opt, ref_data.next_batches(), device, dtype)}
    return runs, raw, our_opt


def distributed_runs(args, cfg: ModelConfig, env: DistEnv, compile: bool, data: Path) -> tuple[Runs, GPT, object]:
    """DDP with plain AdamW and DDP with ZeRO-1, as the trainer builds them."""
    runs, first = {}, None
    for name, shard in (("DDP", False), ("ZeRO-1", True)):
        torch.manual_seed(0)
        raw = GPT(cfg).to(env.device)
        opt = make_optimizer(raw, TrainConfig(), env.device_type, shard)
        model = wrap_ddp(torch.compile(raw) if compile else raw, raw, env)
        loader = synthetic_loader(data, cfg.block_size, args.batch, args.accum, env)
        runs[name] = _iteration(model, raw, opt, loader, StepContext(env, amp_dtype(env.device), 1.0))
        first = first or (raw, opt)
    return runs, *first


def measure(runs: Runs, args, device: torch.device, clock) -> dict:
    """Warm up, then time every run `args.steps` times, interleaved (background
    load hits all alike); the fastest and the median of each, in seconds."""
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        for run in runs.values():
            run()
    synchronize(device)
    warmup_s = time.perf_counter() - t0
    times = {name: [] for name in runs}
    for _ in range(args.steps):
        for name, run in runs.items():
            times[name].append(timed(run, device, clock))
    # The fastest of several steps: interference only ever adds time.
    return {"warmup_s": warmup_s, **{name: (min(t), statistics.median(t)) for name, t in times.items()}}


def report_recompute(model: GPT, opt, args, cfg: ModelConfig, device: torch.device) -> None:
    """Our eager step with and without per-block recomputation, interleaved,
    on the same model and batches (the baseline is the step without it)."""
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


def report_steps(r: dict, names: tuple[str, str], tokens: int, model: GPT, env: DistEnv,
                 label: str) -> tuple[float, float | None]:
    """Print each run's figures and the ratio of the first to the second;
    returns the first's global tokens/s and its MFU (a fraction; None
    without a known peak), per GPU."""
    for name in names:
        best, median = r[name]
        print(f"{label}{name:>9}: {tokens / best:,.0f} tok/s (best {1000 * best:.1f} ms/iteration, "
              f"median {1000 * median:.1f} ms)")
        util = mfu(model.flops_per_token(), tokens / best / env.world_size, peak_flops(env.device))
        if util is not None:
            print(f"{label}{name:>9}: MFU (model FLOPs 6N + attention, dense bf16 peak) {100 * util:.1f}%")
    first, second = names
    print(f"{label}ratio {first}/{second} (tokens/s): {r[second][0] / r[first][0]:.3f}x best, "
          f"{r[second][1] / r[first][1]:.3f}x median; warm-up (compilation) {r['warmup_s']:.1f}s")
    tok_s = tokens / r[first][0]
    return tok_s, mfu(model.flops_per_token(), tok_s / env.world_size, peak_flops(env.device))


def report_overheads(step: float, model: GPT, opt) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        o = measure_checkpoint(model, opt, Path(tmp))
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
    parser.add_argument("--record", action="store_true",
                        help=f"append this run's figures to {figures_on_record.RESULTS.name} "
                             "(GPU runs: figures on record)")
    args = parser.parse_args()
    if args.record and not args.cuda:
        parser.error(f"--record keeps GPU figures only ({figures_on_record.RESULTS.name}): add --cuda, "
                     "on a GPU machine")
    torch.set_num_threads(args.threads)
    # The process group under torchrun, TF32 on CUDA (on every supported torch).
    with distributed("cuda" if args.cuda else "cpu") as env, tempfile.TemporaryDirectory() as data:
        run(args, env, Path(data))


def run(args, env: DistEnv, data: Path) -> None:
    device = env.device
    if args.cuda:
        cfg = ModelConfig()
        args.batch = auto_batch(cfg, env) if args.batch in (None, "auto") else int(args.batch)
        torch.cuda.empty_cache()  # the probe's model is gone; hand its blocks back
        modes = (False, True)
    else:
        cfg = ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=128)
        args.batch = int(args.batch or 4)
        modes = (args.compile,)
    tokens = args.batch * args.accum * cfg.block_size * env.world_size
    # On a CPU shared with other work, wall time measures the neighbours too:
    # one single-threaded process timed in CPU time measures its own work.
    cpu_time = device.type == "cpu" and args.threads == 1 and not env.is_distributed
    clock = time.process_time if cpu_time else time.perf_counter
    say = print if env.is_main else (lambda *a, **k: None)
    say(f"device {records.device_name(device)} x {env.world_size} | model L{cfg.n_layer} H{cfg.n_head} "
        f"C{cfg.n_embd} T{cfg.block_size} | micro-batch {args.batch} x {args.accum} per rank | {tokens} tokens/"
        f"iteration | dtype {amp_dtype(device) or torch.float32} | {'CPU time, 1 thread' if cpu_time else 'wall time'}")
    build, names = (distributed_runs, ("DDP", "ZeRO-1")) if env.is_distributed else (single_runs, ("ours", "reference"))
    tok_s, util = {}, {}
    for compile in modes:
        label = "compiled " if compile else ("eager " if args.cuda else "")
        runs, model, opt = build(args, cfg, env, compile, data)
        r = measure(runs, args, device, clock)
        if env.is_main:
            tok_s[compile], util[compile] = report_steps(r, names, tokens, model, env, label)
        if not env.is_distributed and compile == modes[0]:
            report_recompute(model, opt, args, cfg, device)
        if not env.is_distributed and compile == modes[-1]:
            report_overheads(r["ours"][0], model, opt)
        del runs, model, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if len(tok_s) == 2:
        say(f"ratio compiled/eager ({names[0]}, tokens/s): {tok_s[True] / tok_s[False]:.3f}x best")
    if args.record and env.is_main:
        row = records.train_step_record(device, env.world_size if device.type == "cuda" else 0, args.batch,
                                        tok_s.get(False), tok_s.get(True), util[modes[-1]])
        say(f"recorded in {figures_on_record.append(row)}: {row}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
