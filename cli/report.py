"""`gpt2 report`: one PNG comparing training runs from MLflow, validation loss
and HellaSwag acc_norm (± one standard error) against tokens trained, with the
published GPT-2 124M numbers as reference lines; scores on the built-in format
sample (smoke's) on a panel of their own, without GPT-2's benchmark line; CORE,
where a run scored it (eval.core_every, eval.tasks=core), against GPT-2's
published CORE for the run's model size (nanochat dev/LEADERBOARD.md).

    gpt2 report                                          # the experiment's 5 newest training runs
    gpt2 report --runs smoke-1a2b3c4d5e6f,4f1e0c… --out compare.png --json
    gpt2 report --root gs://bucket/gpt2 --set tracking.uri=https://mlflow.example.com
    gpt2 report --runs RUN --parent-run PARENT_RUN_ID    # also logged to that run as an artifact
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.common import JsonOpt, PresetOpt, RootOpt, SetOpt, emit, fail, load_config, setup_logging


def report(
    runs: Optional[list[str]] = typer.Option(
        None, "--runs", "-r", help="Run ids or run names, repeatable or comma-separated "
        "(default: the experiment's newest training runs, see --newest)."),
    newest: int = typer.Option(5, "--newest", min=1, help="Training runs drawn when --runs is not given."),
    experiment: Optional[str] = typer.Option(
        None, "--experiment", help="MLflow experiment (default: tracking.experiment)."),
    tracking_uri: Optional[str] = typer.Option(
        None, "--tracking-uri", help="MLflow tracking URI (default: as the stages resolve it: tracking.uri, "
        "$MLFLOW_TRACKING_URI, else the SQLite store under the artifact root)."),
    out: Path = typer.Option(Path("report.png"), "--out", "-o", help="Where the PNG is written."),
    parent_run: Optional[str] = typer.Option(
        None, "--parent-run", help="An MLflow run id (a pipeline's parent run) to log the PNG to as an artifact."),
    preset: str = PresetOpt,
    sets: Optional[list[str]] = SetOpt,
    root: Optional[str] = RootOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Validation loss, HellaSwag and CORE (where scored) of MLflow runs against tokens, in one PNG."""
    from gpt2.errors import UserError
    from gpt2.tracking.store import default_tracking_uri
    from tasks.runs_report import make_report

    config = load_config(preset, sets, root)
    setup_logging()
    selectors = [part for value in runs or [] for part in value.split(",") if part.strip()]
    try:
        result = make_report(tracking_uri or default_tracking_uri(config), experiment or config.tracking.experiment,
                             selectors, out, fill_to=0 if selectors else newest, parent_run_id=parent_run)
    except UserError as err:
        fail(str(err))
    emit(result, as_json, describe(result))


def describe(result: dict) -> str:
    """Where the PNG went and what each run contributed (what was skipped, and
    why, is already on stderr)."""
    lines = [f"report: {result['path']}"]
    for line in result["lines"]:
        tokens, value = line["last"]
        points = f"{line['points']} point{'s' if line['points'] != 1 else ''}"
        error = f" ± {line['last_stderr']:.2g}" if line.get("last_stderr") else ""
        lines.append(f"  {line['panel']:<16} {line['label']}: {points}, last {value:.4g}{error} at {tokens:,} tokens")
    for run in result["runs"]:
        counts = {k: n for k, n in run.get("spikes", {}).items() if n}
        if counts:
            lines.append(f"  loss spikes of {run['name']}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    if result["skipped"]:
        lines.append(f"  {len(result['skipped'])} skipped (see above)")
    if result["parent_run_id"]:
        lines.append(f"logged to MLflow run {result['parent_run_id']}")
    return "\n".join(lines)
