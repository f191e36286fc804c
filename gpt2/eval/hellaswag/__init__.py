"""HellaSwag: data (hub, JSONL file, shipped format sample), lm-eval's
preprocessing, the native batched scorer and lm-eval itself.

The library imports lm-eval only in `harness` (here and in gpt2.eval.harness), so the
training loop's scorer stays light.
"""

from gpt2.eval.hellaswag.items import FORMAT_SAMPLE, HellaSwagDataError, Item, load_items, load_rows
from gpt2.eval.hellaswag.scorer import evaluate_hellaswag, score_items, summarize

__all__ = [
    "FORMAT_SAMPLE",
    "HellaSwagDataError",
    "Item",
    "evaluate_hellaswag",
    "load_items",
    "load_rows",
    "score_items",
    "summarize",
]
