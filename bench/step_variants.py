"""Benchmark: where a compiled GPT-2 124M step spends its GPU time, and what
candidate changes to the step are worth, each against the trainer's step as
it is, in the same process, interleaved.

    python -m bench.step_variants --cuda                 # every variant against the baseline
    python -m bench.step_variants --cuda --profile       # ... and the baseline's kernel split
    python -m bench.step_variants --cuda --only cudnn_attention,coordinate_descent
    python -m bench.step_variants                        # CPU: a small GPT, fp32, to try the harness

A variant is a context active while its model is compiled and stepped (an
attention backend, an inductor option) or another micro-batch; the baseline is
`baseline`: the trainer's compiled step (gpt2.train.compile_choice.compiled) with the
micro-batch `auto` picks. Each variant gets its own model, optimizer and data
path, so compiled graphs never mix. Ratios are tokens/s over the baseline's,
best and median of `--steps` interleaved iterations.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch

from bench.step_data import synthetic_loader
from bench.train_step import _iteration, auto_batch, measure
from gpt2.config.sections import ModelConfig
from gpt2.config.train import TrainConfig
from gpt2.model import GPT
from gpt2.process.distributed import amp_dtype, distributed
from gpt2.train.optim import make_optimizer
from gpt2.train.step import StepContext
from gpt2.train.throughput import mfu, peak_flops, synchronize


def _sdpa(backend_name: str) -> Callable[[], contextlib.AbstractContextManager]:
    def ctx():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([getattr(SDPBackend, backend_name)])
    return ctx


def _inductor(**options) -> Callable[[], contextlib.AbstractContextManager]:
    def ctx():
        import torch._inductor.config as inductor_config
        return inductor_config.patch(**options)
    return ctx


# name -> (context while compiling and stepping, micro-batch factor vs the baseline)
VARIANTS: dict[str, tuple[Callable[[], contextlib.AbstractContextManager], float]] = {
    "baseline": (contextlib.nullcontext, 1),
    "flash_attention": (_sdpa("FLASH_ATTENTION"), 1),
    "cudnn_attention": (_sdpa("CUDNN_ATTENTION"), 1),
    "coordinate_descent": (_inductor(coordinate_descent_tuning=True), 1),
    # torch.compile(mode="max-autotune-no-cudagraphs"): GEMM and Triton templates tuned (minutes to compile)
    "max_autotune": (_inductor(max_autotune=True), 1),
    "half_micro_batch": (contextlib.nullcontext, 0.5),
}

# Kernel names -> what they do, first match wins: flash/cuDNN attention, cuBLAS/CUTLASS
# GEMMs, the loss (inductor fuses it into Triton kernels named for log_softmax/nll_loss),
# inductor's other Triton kernels (layer norm, GELU, residual adds: their names say
# "layer_norm", so they go before the optimizer's pattern), the fused AdamW and the
# foreach kernels of gradient clipping.
CATEGORIES = [
    ("attention", r"flash|fmha|cudnn|sdpa|attention"),
    ("matmul", r"gemm|cutlass|nvjet|sm90_xmma|sm80_xmma|wgmma"),
    ("loss", r"nll|log_softmax|cross_entropy"),
    ("triton (layer norm, GELU, adds, casts)", r"^triton"),
    ("optimizer and clipping", r"adam|multi_tensor|foreach|norm"),
    ("embedding", r"embedding|index"),
    ("copy", r"copy|memcpy|memset|fill"),
]


def build(name: str, cfg: ModelConfig, env, batch: int, accum: int, data: Path, compile: bool):
    """One variant's model, optimizer and loader; the step runs under its context."""
    ctx_factory, factor = VARIANTS[name]
    micro = max(1, int(batch * factor))
    torch.manual_seed(0)
    raw = GPT(cfg).to(env.device)
    opt = make_optimizer(raw, TrainConfig(), env.device_type)
    model = torch.compile(raw, dynamic=False) if compile else raw  # as gpt2.train.compile_choice.compiled
    loader = synthetic_loader(data / name, cfg.block_size, micro, int(accum * batch / micro), env)
    step = _iteration(model, raw, opt, loader, StepContext(env, amp_dtype(env.device), 1.0))

    def run():
        with ctx_factory():
            return step()
    return run, raw


def kernel_split(run: Callable[[], object], device: torch.device, steps: int = 2) -> None:
    """Profile `steps` iterations: GPU time per category and the top kernels,
    against the wall time (the gap is the GPU waiting on the host)."""
    from torch.profiler import ProfilerActivity, profile
    synchronize(device)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        synchronize(device)
    wall = (time.perf_counter() - t0) / steps
    kernels = defaultdict(float)
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t and e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.key] += t / 1e6 / steps
    gpu = sum(kernels.values())
    split = defaultdict(float)
    for k, t in kernels.items():
        cat = next((c for c, pat in CATEGORIES if re.search(pat, k, re.I)), "other")
        split[cat] += t
    print(f"profile: {1000 * wall:.1f} ms wall per iteration, {1000 * gpu:.1f} ms of kernels "
          f"({100 * gpu / wall:.1f}% busy)")
    for cat, t in sorted(split.items(), key=lambda kv: -kv[1]):
        print(f"  {cat:<52} {1000 * t:8.1f} ms  {100 * t / gpu:5.1f}%")
    print("  top kernels:")
    for k, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:15]:
        print(f"    {1000 * t:8.2f} ms  {k[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="GPT-2 124M on the GPU in bf16, compiled")
    parser.add_argument("--only", default=",".join(v for v in VARIANTS if v not in ("baseline", "max_autotune")),
                        help="comma-separated variants to compare with the baseline (max_autotune only when named)")
    parser.add_argument("--batch", default=None, help="baseline micro-batch (CUDA default: auto)")
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="also print the baseline's kernel split")
    args = parser.parse_args()
    names = ["baseline", *(n for n in args.only.split(",") if n and n != "baseline")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    with distributed("cuda" if args.cuda else "cpu") as env, tempfile.TemporaryDirectory() as tmp:
        if args.cuda:
            cfg, compile = ModelConfig(), True
            batch = auto_batch(cfg, env) if args.batch in (None, "auto") else int(args.batch)
            torch.cuda.empty_cache()
        else:
            cfg, compile = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64), False
            batch = int(args.batch or 4)
        tokens = batch * args.accum * cfg.block_size
        print(f"device {env.device} | {tokens} tokens/iteration | baseline micro-batch {batch} x {args.accum} | "
              f"variants: {', '.join(names[1:])}")
        runs, model = {}, None
        for name in names:
            runs[name], raw = build(name, cfg, env, batch, args.accum, Path(tmp), compile)
            model = model or raw
        r = measure(runs, argparse.Namespace(warmup=args.warmup, steps=args.steps), env.device, time.perf_counter)
        base_best, base_median = r["baseline"]
        for name in names:
            best, median = r[name]
            util = mfu(model.flops_per_token(), tokens / best, peak_flops(env.device))
            print(f"{name:>20}: {tokens / best:,.0f} tok/s (best {1000 * best:.1f} ms, median {1000 * median:.1f} ms)"
                  + (f", MFU {100 * util:.1f}%" if util is not None else "")
                  + f"; vs baseline {base_best / best:.3f}x best, {base_median / median:.3f}x median")
        print(f"warm-up (compilation of {len(names)} models) {r['warmup_s']:.1f}s")
        if args.profile:
            kernel_split(runs["baseline"], env.device)


if __name__ == "__main__":
    main()
