"""Benchmark: what loss-spike detection (gpt2.train.spikes) costs a training
step, and how far above its recent history a clean run's steps lie.

    python -m bench.spike_detector                 # CPU: the cost, then the clean run's z-scores
    python -m bench.spike_detector --cuda          # the cost on a GPU: GPT-2 124M, bf16
    python -m bench.spike_detector --skip-zscores  # the cost only

The cost: whole training steps (batch fetch to optimizer step, as
bench.train_step times them) without detection, against the same steps with
`warn` (the detector judges the numbers the step already read) and with
`skip` (the step's one host read moves before the optimizer step, which runs
only if the detector lets it). Interleaved in one process, so machine noise
hits all three alike; printed as ratios to the step without detection.

The z-scores: the smoke preset trained on its real text (the Python docs
sample, several epochs) with the trainer, every step judged against the
`train.spike_window` before it; the largest upward robust z of the loss and
of the gradient norm, which a default train.spike_zscore must stay above.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.step_data import synthetic_loader
from gpt2.config.overrides import resolve_config
from gpt2.model import GPT
from gpt2.process.distributed import DistEnv, amp_dtype
from gpt2.train.optim import make_optimizer
from gpt2.train.spikes import SpikeDetector
from gpt2.train.step import StepContext, train_step_with_flags
from gpt2.train.throughput import synchronize

VARIANTS = ("off", "warn", "skip")
THRESHOLDS = (4, 6, 8, 10, 12, 15, 20)
"""Candidate train.spike_zscore values: how many clean steps each would call a spike."""


def _step_cost(cuda: bool, rounds: int, steps: int) -> dict[str, float]:
    """Median seconds per step of each variant, interleaved round by round."""
    device = torch.device("cuda" if cuda else "cpu")
    preset = "gpt2-124m" if cuda else "smoke"
    config = resolve_config(preset, {"runtime.device": device.type})
    micro, accum = (16, 2) if cuda else (8, 2)
    env = DistEnv(0, 0, 1, device)
    torch.manual_seed(0)
    model = GPT(config.model).to(device)
    optimizer = make_optimizer(model, config.train, device.type)
    ctx = StepContext(env, amp_dtype(device), config.train.grad_clip)
    detector = SpikeDetector(zscore=6.0, window=config.train.spike_window)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        loader = synthetic_loader(Path(tmp), config.model.block_size, micro, accum, env)
        for i in range(rounds + 1):  # round 0 warms up
            for variant in VARIANTS[i % 3:] + VARIANTS[:i % 3]:  # each variant first in turn
                t0 = time.perf_counter()
                for _ in range(steps):
                    keep = None
                    if variant == "skip":
                        def keep(loss, norm):
                            verdict = detector.judge(0, loss, norm)
                            return verdict is None or not verdict.spike
                    loss, norm, _ = train_step_with_flags(model, model, optimizer, loader.next_batches(), ctx,
                                                          lambda: (), keep)
                    if variant == "warn":
                        detector.judge(0, loss, norm)
                synchronize(device)
                if i:
                    times[variant].append((time.perf_counter() - t0) / steps)
            print(f"round {i}/{rounds} timed", flush=True)
    return {v: statistics.median(t) for v, t in times.items()}


def _judge_cost(window: int, calls: int = 20_000) -> float:
    """Seconds the detector takes to judge one step with a full window: all it adds on the host."""
    detector = SpikeDetector(zscore=6.0, window=window)
    values = torch.rand(calls + window, 2).tolist()
    for loss, norm in values[:window]:
        detector.judge(0, loss, norm)
    t0 = time.perf_counter()
    for loss, norm in values[window:]:
        detector.judge(0, loss, norm)
    return (time.perf_counter() - t0) / calls


def _clean_run_zscores(steps: int, window: int, batch_tokens: int) -> dict[str, float]:
    """The largest upward z of the loss and the gradient norm over a clean smoke run."""
    import logging

    from gpt2.data.prepare import prepare_data
    from gpt2.root import layout
    from gpt2.train.attempts import read_attempts
    from gpt2.train.run import train

    logging.disable(logging.WARNING)  # every step is an event here: no warning per step
    with tempfile.TemporaryDirectory() as tmp:
        # A threshold just above 0: every step above its window's median is recorded with its z-scores.
        config = resolve_config("smoke", {
            "train.max_steps": steps, "train.spike_window": window, "train.total_batch_tokens": batch_tokens,
            "train.micro_batch_size": min(8, batch_tokens // 64), "train.spike_zscore": 1e-9,
            "train.on_spike": "warn", "train.checkpoint_every": steps, "train.eval_every": steps,
            "train.sample_every": steps, "eval.every_steps": 0, "tracking.enabled": False,
            "runtime.device": "cpu", "runtime.work_dir": str(Path(tmp) / "work")}, root=str(Path(tmp) / "root"))
        prepare_data(config)
        train(config)
        events = [e for a in read_attempts(layout.run_dir(config)) for e in a.get("spikes", [])]
    logging.disable(logging.NOTSET)
    worst = [max(float(e["loss_z"]), float(e["grad_norm_z"])) for e in events]
    return {"steps_judged": steps - window, "loss_z_max": max(float(e["loss_z"]) for e in events),
            "grad_norm_z_max": max(float(e["grad_norm_z"]) for e in events),
            "above": {t: sum(z > t for z in worst) for t in THRESHOLDS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="time GPT-2 124M on the GPU")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    parser.add_argument("--clean-steps", type=int, default=600, help="steps of the clean smoke run")
    parser.add_argument("--clean-batch-tokens", type=int, default=1024,
                        help="tokens a step of the clean smoke run (smoke's 1024; fewer: more steps an epoch)")
    parser.add_argument("--skip-zscores", action="store_true", help="time the step only")
    parser.add_argument("--skip-cost", action="store_true", help="the clean run's z-scores only")
    args = parser.parse_args()
    if not args.skip_cost:
        cost = _step_cost(args.cuda, args.rounds, args.steps)
        base = cost["off"]
        print(f"step without detection: {1000 * base:.1f} ms (median of {args.rounds} rounds of {args.steps} steps)")
        for variant in VARIANTS[1:]:
            print(f"  on_spike={variant}: {cost[variant] / base:.3f}x the step without detection")
        judge = _judge_cost(128)
        print(f"the detector alone: {1e6 * judge:.0f} us a step = {judge / base:.2e} of the step without detection")
    if not args.skip_zscores:
        z = _clean_run_zscores(args.clean_steps, 128, args.clean_batch_tokens)
        print(f"clean smoke run, {z['steps_judged']} steps judged against the 128 before each: "
              f"largest loss z {z['loss_z_max']:.2f}, largest grad norm z {z['grad_norm_z_max']:.2f}")
        print("  clean steps a threshold would call spikes: "
              + ", ".join(f"z>{t}: {n}" for t, n in z["above"].items()))


if __name__ == "__main__":
    main()
