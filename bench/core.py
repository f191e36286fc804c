"""CORE throughput: the batched scorer (gpt2.eval.core.scorer) vs the one-at-a-time way (one item
per forward pass through GPT.forward, as nanochat's reference scores), on the same items, with the
same decisions.

    python -m bench.core --preset smoke                               # a synthetic bundle-shaped task set
    python -m bench.core --bundle /path/to/eval_bundle --max-per-task 100 --preset gpt2-124m

Without --bundle the items are CORE-shaped and made here: a 10-shot multiple-choice task (4
options), a 0-shot schema task and a 1-shot language-modelling task. Both ways get the model built
before the clock starts and a few items untimed first. The ratio is items/s batched ÷ items/s one
at a time, both measured in this run.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
import torch.nn.functional as F

from gpt2.config.presets import PRESETS
from gpt2.eval.core.bundle import CoreTask, parse_items
from gpt2.eval.core.fetch import fetch, fetched_tasks, read_file
from gpt2.eval.core.prompts import Example, examples, subsample
from gpt2.eval.core.scorer import decide, score_examples
from gpt2.eval.logprobs import ContinuationScore
from gpt2.model import GPT
from gpt2.tokenizer import N_VOCAB, get_encoding

WORDS = "the a cat dog ran over under house tree river blue green quickly slowly because when".split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def synthetic(n: int) -> list[tuple[CoreTask, list[dict]]]:
    rng = random.Random(0)
    mc = [{"query": _text(rng, 25) + "?", "choices": [_text(rng, 4) for _ in range(4)], "gold": rng.randrange(4)}
          for _ in range(n)]
    schema = [{"context_options": [_text(rng, 20) for _ in range(2)], "continuation": _text(rng, 6), "gold": 0}
              for _ in range(n)]
    lm = [{"context": _text(rng, 40), "continuation": _text(rng, 3)} for _ in range(n)]
    return [(CoreTask("mc_10shot", "multiple_choice", "", 10, " ", 0.25), mc),
            (CoreTask("schema", "schema", "", 0, " ", 0.5), schema),
            (CoreTask("lm_1shot", "language_modeling", "", 1, " ", 0.0), lm)]


def one_at_a_time(model: GPT, ready: list[Example]) -> list[bool]:
    """The reference way: one item per forward pass, every row padded to the longest."""
    out = []
    with torch.no_grad():
        for ex in ready:
            width = max(map(len, ex.rows))
            ids = torch.full((len(ex.rows), width), 50256)
            for k, r in enumerate(ex.rows):
                ids[k, :len(r)] = torch.tensor(r)
            logits = model(ids)[0][:, :, :N_VOCAB].float()
            logp = F.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:, None]).squeeze(2)
            hits = logits[:, :-1].argmax(-1) == ids[:, 1:]
            scores = [ContinuationScore(float(logp[k, s - 1:len(r) - 1].sum()), len(r) - s,
                                        bool(hits[k, s - 1:len(r) - 1].all()))
                      for k, (r, s) in enumerate(zip(ex.rows, ex.starts))]
            out.append(decide(ex, scores).correct)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke", help="model shape (random init)")
    parser.add_argument("--bundle", default=None, help="a CORE bundle (directory, zip or URL); default: synthetic")
    parser.add_argument("--max-per-task", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT(PRESETS[args.preset]().model).eval()
    enc, T = get_encoding("gpt2"), model.config.block_size
    if args.bundle:
        import tempfile
        record = fetch(f"file://{tempfile.mkdtemp()}", args.bundle)
        sets = [(t, parse_items(t, read_file(record, t.data_path).decode(), args.bundle)) for t in fetched_tasks(record)]
    else:
        sets = synthetic(args.max_per_task)
    ready = [ex for task, items in sets for ex in examples(task, subsample(items, args.max_per_task), enc, T)]
    score_examples(model, ready[:4], "cpu", args.batch_size), one_at_a_time(model, ready[:4])  # warm-up
    t0 = time.perf_counter()
    batched = [d.correct for d in score_examples(model, ready, "cpu", args.batch_size)]
    t1 = time.perf_counter()
    plain = one_at_a_time(model, ready)
    t2 = time.perf_counter()
    report = {"items": len(ready), "preset": args.preset, "batch_size": args.batch_size,
              "batched_items_per_s": len(ready) / (t1 - t0), "one_at_a_time_items_per_s": len(ready) / (t2 - t1),
              "same_decisions": batched == plain}
    report["ratio"] = report["batched_items_per_s"] / report["one_at_a_time_items_per_s"]
    if args.json:
        print(json.dumps(report))
        return
    print(f"{report['items']} CORE items, {args.preset} (random init), cpu, {torch.get_num_threads()} threads")
    print(f"batched ({args.batch_size} items a pass): {report['batched_items_per_s']:8.1f} items/s")
    print(f"one at a time:             {report['one_at_a_time_items_per_s']:8.1f} items/s")
    print(f"ratio: {report['ratio']:.2f}x; same decisions on every item: {report['same_decisions']}")


if __name__ == "__main__":
    main()
