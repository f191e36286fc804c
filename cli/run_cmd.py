"""`gpt2 run`: the whole pipeline in this process on the embedded default
(a temporary Prefect server, a local SQLite MLflow store).

    gpt2 run --preset smoke
    gpt2 run --preset smoke --json
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt, emit, run_flow


def run(
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Prepare, train, evaluate and export: every stage cached, so a rerun
    (or a rerun after a crash) only does what is missing."""
    # Any stage's error ends the pipeline; the flow already logged its traceback.
    config, result = run_flow("flows.pipeline:pipeline_flow", preset, sets, root, errors=(Exception,))
    guide = where_things_are(config, result)
    if as_json:
        typer.echo(guide, err=True)
    emit(result, as_json, guide)


def where_things_are(config, result: dict[str, Any]) -> str:
    from gpt2.tracking import default_tracking_uri

    hs = result.get("hellaswag") or {}
    cached = ", ".join(result["cached_stages"]) or "none"
    uri = default_tracking_uri(config)
    ui = (f"mlflow ui --backend-store-uri {uri}  # then open http://127.0.0.1:5000"
          if uri.startswith("sqlite:") else uri)
    lines = [
        f"pipeline finished (cached stages: {cached})",
        f"  final val loss:   {result['final_val_loss']}",
        f"  HellaSwag:        acc {hs.get('acc')}  acc_norm {hs.get('acc_norm')}  (n={hs.get('n')})",
        f"  checkpoint:       {result['checkpoint']}",
        f"  Hugging Face dir: {result['hf_dir']}",
        "      load it:      transformers.GPT2LMHeadModel.from_pretrained('<that dir>')",
        f"  llm.c model:      {result['llmc_bin']}",
        f"  MLflow run:       {result['mlflow_run_id']} (registered model {result['registered_model']} "
        f"v{result['model_version']})",
        f"  MLflow UI:        {ui}",
    ]
    return "\n".join(lines)
