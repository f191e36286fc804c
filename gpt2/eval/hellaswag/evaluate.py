"""The final HellaSwag evaluation of a checkpoint: lm-eval's numbers, checked
against the native scorer item by item, kept in the evaluation's JSON file under the run
(gpt2.eval.evaluate writes it, with the other tasks of eval.tasks):

    {root}/runs/{run}/eval/step_000060/hellaswag.json

`hellaswag` in the result holds lm-eval's acc and acc_norm (the numbers to
compare with published tables), the native scorer's acc_norm_per_token (the
llm.c variant, which lm-eval does not compute) and n; `parity` says whether
both scorers picked the same ending on every item.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.config.tree import Config
from gpt2.eval.harness.model import GPTLM
from gpt2.eval.hellaswag.harness import run_hellaswag
from gpt2.eval.hellaswag.items import HUB_SOURCES, Item, load_rows
from gpt2.eval.hellaswag.scorer import ItemScore, score_items, summarize
from gpt2.root import storage

log = logging.getLogger(__name__)

RESULT_FILE = "hellaswag.json"


def result_url(ref: CheckpointRef, root: str) -> str:
    return storage.join(ref.output_dir(root, "eval"), RESULT_FILE)


def parity(native: Sequence[ItemScore], picks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How far the native scorer is from lm-eval, item by item."""
    if len(native) != len(picks):
        return {"items": len(picks), "agree": False, "reason": f"native scored {len(native)} items, lm-eval {len(picks)}"}
    differ = [p["doc_id"] for s, p in zip(native, picks) if (s.pred, s.pred_norm) != (p["pred"], p["pred_norm"])]
    diff = max(
        (abs(a.logprob - b) for s, p in zip(native, picks) for a, b in zip(s.scores, p["loglikelihoods"])),
        default=0.0,
    )
    return {"items": len(picks), "agree": not differ, "differing_items": differ[:20], "max_abs_logprob_diff": diff}


def hellaswag_result(config: Config, model: Any, device: Any) -> dict[str, Any]:
    """lm-eval's hellaswag and the native scorer on `model`: the HellaSwag part of the result
    (see module docstring)."""
    cfg = config.eval
    hub = cfg.hellaswag_source in HUB_SOURCES
    rows = load_rows(cfg.hellaswag_source, cfg.limit)
    native = score_items(model, [Item.from_row(r) for r in rows], device, cfg.batch_size)
    work_dir = config.runtime.work_root
    lm = run_hellaswag(GPTLM(model, device, batch_size=4 * cfg.batch_size), None if hub else rows, work_dir, limit=cfg.limit)
    check = parity(native, lm["picks"])
    if not check["agree"]:
        log.warning("native scorer and lm-eval disagree: %s", check)
    summary = summarize(native)
    return {
        "hellaswag": {
            "acc": lm["acc"],
            "acc_norm": lm["acc_norm"],
            "acc_norm_per_token": summary["acc_norm_per_token"],
            "acc_stderr": lm["acc_stderr"],
            "acc_norm_stderr": lm["acc_norm_stderr"],
            "n": lm["n"],
        },
        "native": summary,
        "parity": check,
        "lm_eval": {"task": lm["task"], "results": lm["raw"]},
        "source": cfg.hellaswag_source,
        "benchmark": hub,
    }
