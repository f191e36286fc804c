"""HellaSwag throughput: the native batched scorer vs lm-eval's Hugging Face
backend (`lm-eval --model hf`, default batch settings) on the exported
directory of the same weights, on the same items. Target: ≥ 3×.

    python -m bench.hellaswag                                  # random-init gpt2-124m, format sample
    python -m bench.hellaswag --preset smoke --repeat 4
    python -m bench.hellaswag --checkpoint file:///…/checkpoints/step_019073 --source hf://datasets/Rowan/hellaswag --limit 500

Both scorers get their model loaded before the clock starts; each first
scores a few items untimed (warm-up), then all items in alternating timed
rounds, keeping its best. The ratio is items/s native ÷ items/s lm-eval, both
measured in this run.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import torch

from gpt2.checkpoint.store import load_model
from gpt2.config.presets import PRESETS
from gpt2.export.hf import write_hf_dir
from gpt2.eval.hellaswag import Item, load_rows, score_items, summarize
from gpt2.eval.hellaswag.harness import run_hellaswag
from gpt2.model import GPT
from gpt2.process.distributed import pick_device


def load(args: argparse.Namespace, device: torch.device) -> GPT:
    if args.checkpoint:
        return load_model(args.checkpoint, str(device))[0]
    torch.manual_seed(0)
    return GPT(PRESETS[args.preset]().model).to(device).eval()


def timed(fn) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-124m", help="model shape when no --checkpoint (random init)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory URL")
    parser.add_argument("--source", default="builtin:format-sample")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="score the items this many times over (small sources)")
    parser.add_argument("--batch-size", type=int, default=8, help="native scorer: items per forward")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds; the best of each scorer counts")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    device = pick_device(args.device)
    model = load(args, device)
    rows = load_rows(args.source, args.limit) * args.repeat
    items = [Item.from_row(r) for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = write_hf_dir(model.state_dict(), model.config, Path(tmp) / "hf")
        from lm_eval.models.huggingface import HFLM

        hflm = HFLM(pretrained=str(hf_dir), device=str(device), dtype="float32")  # lm-eval's default batch size
        score_items(model, items[:4], device, args.batch_size)  # warm-up
        run_hellaswag(hflm, rows[:4], tmp)
        # Alternate the two and keep each one's best round: on a shared
        # machine, load from other processes then hits both alike.
        t_native = t_lm = float("inf")
        for _ in range(args.rounds):
            native, t = timed(lambda: score_items(model, items, device, args.batch_size))
            t_native = min(t_native, t)
            lm, t = timed(lambda: run_hellaswag(hflm, rows, tmp))
            t_lm = min(t_lm, t)

    ours = summarize(native)
    same = [(s.pred, s.pred_norm) for s in native] == [(p["pred"], p["pred_norm"]) for p in lm["picks"]]
    report = {
        "items": len(items),
        "model": f"{args.checkpoint or 'random-init ' + args.preset} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params)",
        "device": str(device),
        "native_items_per_s": len(items) / t_native,
        "lm_eval_hf_items_per_s": len(items) / t_lm,
        "ratio": t_lm / t_native,
        "same_picks": same,
        "acc_norm": {"native": ours["acc_norm"], "lm_eval_hf": lm["acc_norm"]},
    }
    if args.json:
        print(json.dumps(report))
        return
    print(f"{report['items']} items, {report['model']}, {device}")
    print(f"native scorer (batch {args.batch_size} items): {report['native_items_per_s']:8.2f} items/s")
    print(f"lm-eval --model hf (default batch):  {report['lm_eval_hf_items_per_s']:8.2f} items/s")
    print(f"ratio: {report['ratio']:.1f}x (target >= 3x); same picks on every item: {same}")


if __name__ == "__main__":
    main()
