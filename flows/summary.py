"""What a pipeline run says when it ends: the same lines in `gpt2 run`'s
output and in the orchestrated run's log and Prefect artifact
(flows.pipeline), so a run started with `prefect deployment run
gpt2/full-pipeline` says what it did too."""

from __future__ import annotations

import shlex
from typing import Any

from gpt2.config.tree import Config
from gpt2.report.reference_lines import HELLASWAG_GPT2

SUMMARY_RECORD = "pipeline_summary"
"""Marks the summary's log record (`extra={SUMMARY_RECORD: True}`): `gpt2 run` prints the summary
itself, so its console leaves the record out (the log file and Prefect's run log keep it)."""


def describe_bill(bill: dict[str, Any] | None) -> str:
    """One line of the bill (gpt2.train.bill; docs/plan.md, "What a run cost", says what each figure means)."""
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
        rest = bill["device_hours"] - sum(part["device_hours"] for part in pools.values())
        if rest >= 0.0005:  # so the pools add up to the total at a glance
            unknown = (bill.get("pools") or {}).get("unknown") or {}
            line += (f"; no pool recorded {unknown.get('attempts', 0)} attempt(s), {rest:,.3f} device-hours "
                     "(run outside a work pool, or before the pool was recorded)")
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


SAMPLE_NOTE = ("(the built-in format sample: checks the scorer, not the benchmark, so not comparable with "
               f"GPT-2's {HELLASWAG_GPT2.value:.1%}.\n{{pad}}Its right endings are its longest, and acc, "
               "not normalised by length, prefers short ones, so it starts near 0)")
"""What a score on the built-in format sample is, and what its `acc` means (smoke's HellaSwag)."""
_PAD = " " * 20  # the indent and width of the summary's labels


def describe_hellaswag(config: Config, hs: dict[str, Any]) -> str:
    """The HellaSwag line: acc, acc_norm with its standard error (lm-eval's), and
    on the built-in format sample, what that is and what its acc means."""
    line = f"acc {_figure(hs.get('acc'))}  acc_norm {_figure(hs.get('acc_norm'))}  (n={hs.get('n')})"
    if hs.get("acc_norm_stderr") is not None:
        line += f"  standard error of acc_norm {hs['acc_norm_stderr']:.4f}"
    if config.eval.hellaswag_source.startswith("builtin:"):
        line += "\n" + _PAD + SAMPLE_NOTE.format(pad=_PAD)
    return line


def describe_tasks(result: dict[str, Any]) -> list[str]:
    """CORE and each further task of eval.tasks: accuracy, centered accuracy (CORE's tasks) and
    standard errors; none when only HellaSwag was evaluated."""
    lines = []
    core = result.get("core")
    if core:
        err = f" ± {core['stderr']:.4f}" if core.get("stderr") is not None else ""
        lines.append(f"  CORE:             {core['score']:.4f}{err} (mean centered accuracy of {core['tasks']} tasks; "
                     "GPT-2 124M: 0.1139)")
    for name, task in (result.get("tasks") or {}).items():
        acc = task.get("acc")
        line = f"    {name}: acc {_figure(acc)}" if acc is not None else f"    {name}: {task.get('metrics')}"
        if acc is not None and task.get("acc_stderr") is not None:
            line += f" ± {task['acc_stderr']:.4f}"
        if task.get("centered") is not None:
            line += f"  centered {task['centered']:.4f}"
        lines.append(line + f"  (n={task.get('n')})")
    return lines


def describe_report(result: dict[str, Any]) -> list[str]:
    """Where the runs report is: `report.png`, an artifact of the pipeline's parent
    MLflow run (flows.pipeline); none without a run of its own."""
    run_id = result.get("mlflow_run_id")
    if not run_id:
        return []
    return [f"  runs report:      report.png, an artifact of MLflow run {run_id}: validation loss and HellaSwag "
            "against tokens,\n" + _PAD + "this run beside the experiment's newest "
            "(`gpt2 report` draws it for any runs)"]


def where_things_are(config: Config, result: dict[str, Any]) -> str:
    from gpt2.secrets import redact
    from gpt2.tracking.store import default_tracking_uri

    hs = result.get("hellaswag") or {}
    cached = ", ".join(result["cached_stages"]) or "none"
    uri = redact(default_tracking_uri(config))
    link = result.get("mlflow_url") or uri  # the run itself in the runs view (gpt2.tracking.experiment.ui_link)
    # Shell-quoted: a root with a space (or any shell character) pastes as one argument.
    ui = f"mlflow ui --backend-store-uri {shlex.quote(uri)}  # then open {link}" if uri.startswith("sqlite:") else link
    lines = [
        f"pipeline finished (cached stages: {cached})",
        f"  final val loss:   {_figure(result['final_val_loss'])}",
        f"  HellaSwag:        {describe_hellaswag(config, hs) if hs else 'not evaluated (not in eval.tasks)'}",
        *describe_tasks(result),
        f"  checkpoint:       {result['checkpoint']}",
        f"  Hugging Face dir: {result['hf_dir']}",
        "      load it:      transformers.GPT2LMHeadModel.from_pretrained('<that dir>')",
        f"  llm.c model:      {result['llmc_bin']}",
        f"  MLflow run:       {result['mlflow_run_id'] or _no_run_of_its_own(result)} (registered model "
        f"{result['registered_model']} "
        f"v{result['model_version']})",
        *describe_report(result),
        f"  MLflow UI:        {ui}",
        f"  {describe_bill(result.get('bill'))}",
        *describe_rungs(result.get("rungs")),
    ]
    return "\n".join(lines)
