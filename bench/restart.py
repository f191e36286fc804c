"""A preempted attempt's start-up, cold and warm: a compiled run is SIGKILLed
once its second checkpoint is complete, then restarted with a fresh, empty
inductor cache directory (as on a new machine), and each attempt's start-up
parts (the attempt records' `startup_parts`) are printed side by side with
the ratio warm/cold of the compile part and of the whole start-up.

    python -m bench.restart                                  # smoke model, CPU
    python -m bench.restart --cuda --preset gpt2-124m --record

Data: random tokens written where the data stage would put them
(gpt2.data.synthetic), so it runs on a machine without a corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpt2.checkpoint import catalog
from gpt2.config.overrides import resolve_config
from gpt2.data.synthetic import random_tokens, write_dataset
from gpt2.report import figures_on_record
from gpt2.root import layout
from gpt2.train.attempts import read_attempts
from gpt2.train.startup import PARTS


def _config(args: argparse.Namespace, root: Path):
    return resolve_config(args.preset, {
        "data.name": "bench_restart", "data.source": "synthetic", "runtime.work_dir": str(root / "work"),
        "runtime.device": "cuda" if args.cuda else "cpu", "runtime.compile": True, "tracking.enabled": False,
        "train.max_steps": args.steps, "train.checkpoint_every": 2, "train.eval_every": 10_000,
        "train.val_steps": 1, "train.sample_every": 10_000, "eval.every_steps": 0,
        **({"train.total_batch_tokens": 4096, "train.micro_batch_size": 8} if args.preset == "smoke" else {}),
    }, root=str(root / "root"))


KILL_AFTER_STEP = 4
"""The second checkpoint (one every 2 steps)."""


def _attempt(run_json: Path, cache: Path, env: dict, kill_in: str | None) -> int:
    """One attempt in a fresh process with its own (empty) inductor cache; with
    `kill_in` (the run's directory) it is SIGKILLed once the checkpoint of
    step KILL_AFTER_STEP is complete there."""
    proc = subprocess.Popen([sys.executable, "-m", "gpt2.train", "--config", str(run_json)],
                            env={**env, "TORCHINDUCTOR_CACHE_DIR": str(cache)}, stdout=subprocess.DEVNULL)
    while kill_in and proc.poll() is None:
        latest = catalog.latest_checkpoint(kill_in)
        if latest and int(latest.rstrip("/").rsplit("step_", 1)[1]) >= KILL_AFTER_STEP:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.2)
    return proc.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuda", action="store_true", help="on the GPU (default: CPU)")
    p.add_argument("--preset", default="smoke")
    p.add_argument("--steps", type=int, default=6, help="the run's train.max_steps (a checkpoint every 2; > 4)")
    p.add_argument("--record", action="store_true", help="append the figures to bench/results.jsonl (GPU only)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        root = Path(tmp)
        config = _config(args, root)
        t = config.train
        need = (t.max_steps + 2) * t.total_batch_tokens
        write_dataset(config, [("val", random_tokens(t.total_batch_tokens + 1, 1)),
                               ("train", random_tokens(need, 2))], {"kind": "random"})
        run_json = root / "run.json"
        run_json.write_text(json.dumps(config.model_dump(mode="json")))
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
               "GPT2_COMPILE_CACHE_SECRET": secrets.token_hex(16)}
        run_dir = layout.run_dir(config)
        code = _attempt(run_json, root / "cache-cold", env, run_dir)
        print(f"attempt 1: killed after its second checkpoint (exit {code}); attempt 2: an empty compiler cache",
              file=sys.stderr)
        code = _attempt(run_json, root / "cache-warm", env, None)
        if code != 0:
            sys.exit(f"the restarted attempt failed (exit {code})")
        cold, warm = (r["startup_parts"] for r in read_attempts(run_dir)[:2])
    print(f"{args.preset} on {'cuda' if args.cuda else 'cpu'}, compiled; start-up parts in seconds")
    print(f"{'part':<12}{'cold':>10}{'warm':>10}{'warm/cold':>12}")
    for part in PARTS:
        ratio = f"{warm[part] / cold[part]:.2f}" if cold[part] > 0 else "-"
        print(f"{part:<12}{cold[part]:>10.2f}{warm[part]:>10.2f}{ratio:>12}")
    whole = (sum(cold.values()), sum(warm.values()))
    print(f"{'whole':<12}{whole[0]:>10.2f}{whole[1]:>10.2f}{whole[1] / whole[0]:>12.2f}")
    print(f"ratio warm/cold: compile {warm['compile'] / cold['compile']:.2f}, whole start-up "
          f"{whole[1] / whole[0]:.2f}")
    if args.record and args.cuda:
        import torch

        record = figures_on_record.figures_record("restart", torch.cuda.get_device_name(0), torch.__version__, {
            "preset": args.preset, "cold": cold, "warm": warm,
            "compile_warm_over_cold": warm["compile"] / cold["compile"], "startup_warm_over_cold": whole[1] / whole[0]})
        print(f"recorded in {figures_on_record.append(record)}")


if __name__ == "__main__":
    main()
