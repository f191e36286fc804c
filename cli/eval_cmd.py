"""`gpt2 evaluate` and `gpt2 export`: the stages that read a checkpoint.

    gpt2 evaluate --preset smoke --json
    gpt2 evaluate --preset gpt2-124m --set eval.limit=1000 --checkpoint gs://b/runs/r/checkpoints/step_019073
    gpt2 export --preset smoke --json
"""

from __future__ import annotations

from typing import Optional

import typer

from cli.common import (
    JsonOpt,
    PresetOpt,
    RootOpt,
    SetOpt,
    emit,
    run_flow,
)

CheckpointOpt = typer.Option(
    "latest", "--checkpoint", help="A checkpoint directory URL, or `latest`: the newest complete one of the preset's run."
)

EVAL_KEYS = ("hellaswag", "mlflow_run_id", "native", "parity", "source", "benchmark", "checkpoint", "step", "result_url", "cached")


def evaluate(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    checkpoint: str = CheckpointOpt,
    as_json: bool = JsonOpt,
) -> None:
    """HellaSwag of a checkpoint with lm-eval, checked against the native scorer (cached)."""
    _, result = run_flow("flows.evaluate:eval_flow", preset, sets, root, checkpoint=checkpoint)
    out = {k: result.get(k) for k in EVAL_KEYS}
    h = out["hellaswag"]
    emit(
        out,
        as_json,
        f"{'cached' if result['cached'] else 'evaluated'} step {result['step']} on {result['source']} "
        f"({h['n']} items): acc {h['acc']:.4f}, acc_norm {h['acc_norm']:.4f}, "
        f"acc_norm_per_token {h['acc_norm_per_token']:.4f}; native scorer "
        f"{'agrees' if result['parity']['agree'] else 'DISAGREES'}\nresult: {result['result_url']}",
    )


def export(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    checkpoint: str = CheckpointOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Export a checkpoint as a Hugging Face directory and llm.c files; register the HF model in MLflow (cached)."""
    _, result = run_flow("flows.export:export_flow", preset, sets, root, checkpoint=checkpoint)
    emit(
        result,
        as_json,
        f"{'cached' if result['cached'] else 'exported'} step {result['step']}\nhf: {result['hf_dir']}\n"
        f"llm.c: {result['llmc_bin']}\nregistered: {result['registered_model']} v{result['model_version']}"
        f" (alias {result['alias']})",
    )
