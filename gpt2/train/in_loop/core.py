"""CORE scored inside the training loop: every eval.core_every steps (and at the last step),
eval.max_per_task items of each task of the bundle (nanochat's in-loop look uses 500), read
from the root's copy (gpt2.eval.core.fetch.for_training: fetched before training, never here).

Items are split over ranks as the in-loop HellaSwag splits them, and each task's right answers
and items summed: every item's few-shot draws are those of the whole cut, whichever rank scores
it, so the sum is the one-process score. It never stops training: a bundle that cannot be read
costs a warning, and a rank that fails to score still joins the sum (its failure goes to
`on_error`). Logged as the evaluate stage logs CORE (tasks.evaluate): core/score, core/stderr,
core/<label>/acc, core/<label>/centered.
"""

from __future__ import annotations

import logging

import torch

from gpt2.eval.core.bundle import CoreTask, parse_items
from gpt2.eval.core.fetch import fetched_tasks, for_training, read_file
from gpt2.eval.core.prompts import Example, examples, subsample
from gpt2.eval.core.score import combine, task_result
from gpt2.eval.core.scorer import score_examples
from gpt2.model import GPT
from gpt2.process.distributed import all_reduce, autocast
from gpt2.tokenizer import get_encoding
from gpt2.train.in_loop.scorer import InLoopScorer

log = logging.getLogger(__name__)


class InLoopCore(InLoopScorer):
    what = "CORE"

    def every(self) -> int:
        return self.cfg.eval.core_every

    def source(self) -> str:
        return f"CORE bundle {self.cfg.eval.core_bundle}"

    def read_share(self) -> list[tuple[CoreTask, list[Example]]] | None:
        """Each task's items of this rank."""
        record = for_training(self.cfg, fetching=False)
        enc, block = get_encoding("gpt2"), self.cfg.model.block_size
        out = []
        for task in fetched_tasks(record):
            items = subsample(parse_items(task, read_file(record, task.data_path).decode("utf-8"), record["source"]),
                              self.cfg.eval.max_per_task)
            share = range(self.env.rank, len(items), self.env.world_size)
            out.append((task, examples(task, items, enc, block, record["source"], only=share)))
        log.info("in-loop CORE: %d tasks, %d items on this rank", len(out), sum(len(e) for _, e in out))
        return out or None

    def score(self, model: GPT, done: int) -> dict[str, float] | None:
        """CORE and each task's numbers over every rank's items."""
        counts: list[float] = []
        try:
            with autocast(self.env.device, self.amp):
                for _, mine in self.share:
                    picks = score_examples(model, mine, self.env.device, self.cfg.eval.batch_size) if mine else []
                    counts += [sum(d.correct for d in picks), len(picks)]
        except Exception as err:  # noqa: BLE001 - an OOM on this rank: it still joins the sum below
            self.on_error(err, f"scoring CORE at step {done}")
            counts = [0.0] * (2 * len(self.share))
        summed = all_reduce(torch.tensor(counts, dtype=torch.float64, device=self.env.device), self.env, op="sum")
        totals = [int(v) for v in summed.tolist()]
        results = {task.label: task_result(task, [True] * right + [False] * (n - right))
                   for (task, _), right, n in zip(self.share, totals[::2], totals[1::2]) if n}
        if not results:
            return None
        core = combine(results)
        metrics = {"core/score": core["score"], "core/stderr": core["stderr"]}
        for label, r in results.items():
            metrics.update({f"core/{label}/acc": r["acc"], f"core/{label}/centered": r["centered"]})
        return {k: float(v) for k, v in metrics.items() if v is not None}

    def describe(self, metrics: dict[str, float], done: int) -> str:
        """CORE's score (its tasks are in MLflow)."""
        tasks = sum(1 for k in metrics if k.endswith("/centered"))
        return f"CORE at step {done}: {metrics['core/score']:.4f} over {tasks} tasks"
