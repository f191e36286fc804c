"""What a pipeline run says when it ends: the same lines in `gpt2 run`'s
output and in the orchestrated run's log and Prefect artifact
(flows.pipeline), so a run started with `prefect deployment run
gpt2/full-pipeline` says what it did too."""

from __future__ import annotations

import shlex
from typing import Any

from gpt2.config import Config


def describe_bill(bill: dict[str, Any] | None) -> str:
    """One line of the bill (gpt2.bill; docs/plan.md, "What a run cost", says what each figure means)."""
    if not bill:
        return "bill: (not recorded)"
    cost = f"{bill['cost']:,.2f}" if bill.get("cost") is not None else "unknown (set runtime.price_per_hour)"
    line = (f"bill: {bill['attempts']} attempt(s), {bill['device_hours']:,.3f} device-hours, "
            f"{bill['steps_redone']} steps redone ({bill['device_hours_redone']:,.3f} device-hours), "
            f"{bill['startup_s']:,.0f} s start-up, cost {cost}")
    if "cpu_hours" in bill:
        line += f"; CPU stages {bill['cpu_hours']:,.3f} h"
    pools = {pool: part for pool, part in (bill.get("pools") or {}).items() if pool != "unknown"}
    if pools:  # where the GPU hours went, on a ladder of GPU pools
        line += "\n  by pool: " + "; ".join(
            f"{pool} {part['attempts']} attempt(s), {part['device_hours']:,.3f} device-hours, cost "
            + (f"{part['cost']:,.2f}" if part.get("cost") is not None else "unknown") for pool, part in pools.items())
    return line


def describe_rungs(rungs: dict[str, list[dict]] | None) -> list[str]:
    """The ladder of GPU pools, per GPU stage: the rungs tried in order, why each was left."""
    lines = []
    for stage, tried in (rungs or {}).items():
        steps = [f"left {r['left']}" if r["left"] else f"ran on {r['pool']}" for r in tried]
        lines.append(f"  {stage + ' rungs:':18}" + " -> ".join(steps))
    return lines


def _figure(value: float | None) -> str:
    """A loss or an accuracy as the summary prints it (the --json line keeps full precision)."""
    return "n/a" if value is None else f"{value:.4f}"


def _no_run_of_its_own(result: dict[str, Any]) -> str:
    """A pipeline answered from a read-only root (flows.read_only) wrote no run of its own."""
    train = (result.get("stage_mlflow_run_ids") or {}).get("train")
    return f"none written (read-only root; the training run is {train})"


def where_things_are(config: Config, result: dict[str, Any]) -> str:
    from gpt2.secrets import redact
    from gpt2.tracking import default_tracking_uri

    hs = result.get("hellaswag") or {}
    cached = ", ".join(result["cached_stages"]) or "none"
    uri = redact(default_tracking_uri(config))
    link = result.get("mlflow_url") or uri  # the run itself in the runs view (gpt2.tracking.ui_link)
    # Shell-quoted: a root with a space (or any shell character) pastes as one argument.
    ui = f"mlflow ui --backend-store-uri {shlex.quote(uri)}  # then open {link}" if uri.startswith("sqlite:") else link
    lines = [
        f"pipeline finished (cached stages: {cached})",
        f"  final val loss:   {_figure(result['final_val_loss'])}",
        f"  HellaSwag:        acc {_figure(hs.get('acc'))}  acc_norm {_figure(hs.get('acc_norm'))}  (n={hs.get('n')})"
        + ("  (the built-in format sample: a check of the scorer, not the benchmark)"
           if config.eval.hellaswag_source.startswith("builtin:") else ""),
        f"  checkpoint:       {result['checkpoint']}",
        f"  Hugging Face dir: {result['hf_dir']}",
        "      load it:      transformers.GPT2LMHeadModel.from_pretrained('<that dir>')",
        f"  llm.c model:      {result['llmc_bin']}",
        f"  MLflow run:       {result['mlflow_run_id'] or _no_run_of_its_own(result)} (registered model "
        f"{result['registered_model']} "
        f"v{result['model_version']})",
        f"  MLflow UI:        {ui}",
        f"  {describe_bill(result.get('bill'))}",
        *describe_rungs(result.get("rungs")),
    ]
    return "\n".join(lines)
