"""The runs report: training runs read back from MLflow, drawn by
gpt2.report.comparison into one PNG, optionally logged to a pipeline's parent run.
What `gpt2 report` and the parent flow's last step call; it never imports
Prefect, so the command starts quickly.

    report = make_report(uri, "gpt2", ["smoke-1a2b3c4d5e6f"], Path("report.png"))

Talks to MLflow directly (reads, and one artifact), not through the queued
gpt2.tracking.tracker.Tracker: the report needs the answers now.
"""

from __future__ import annotations

import logging
import posixpath
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from gpt2.errors import UserError
from gpt2.report.comparison import (CORE_SCORE, CORE_STDERR, HELLASWAG, PANELS, SPIKE_EVENTS, FigureData, RunCurves,
                                    figure_data)
from gpt2.report.figure import draw_figure
from gpt2.report.reference_lines import HELLASWAG_ITEMS, dataset_of, gpt2_size
from gpt2.root import layout
from gpt2.secrets import redact
from gpt2.tracking.tracker import Tracker

log = logging.getLogger(__name__)

DEFAULT_NEWEST = 5
"""Training runs drawn when none are named (and beside the pipeline's own)."""
TOKENS_PARAM, ROOT_PARAM = "train.total_batch_tokens", "runtime.root"  # the config as the trainer logs it
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_NEWEST_FIRST = ["attributes.start_time DESC"]
HELLASWAG_STDERR = "hellaswag/acc_norm_stderr"  # logged by the evaluate stage beside HELLASWAG
EVALUATED = ((HELLASWAG, HELLASWAG_STDERR), (CORE_SCORE, CORE_STDERR))
"""What is read of the evaluate runs of a training run's checkpoints: each score and its standard error."""
# gpt2.eval.hellaswag.items' HUB_SOURCES and FORMAT_SAMPLE (a test keeps them equal): importing that
# package imports torch, seconds this command does not need.
HUB_SOURCES, FORMAT_SAMPLE = ("Rowan/hellaswag", "hf://datasets/Rowan/hellaswag"), "builtin:format-sample"


def open_store(uri: str) -> Any:
    """An MlflowClient on `uri`; a SQLite store that does not exist is an
    error (reading must not create an empty one)."""
    from mlflow import MlflowClient

    if uri.startswith("sqlite:///") and ":memory:" not in uri and not Path(uri[len("sqlite:///"):]).is_file():
        raise UserError(f"no MLflow store at {redact(uri)}: nothing was tracked there yet. Run a stage first, or "
                        "point at the store with --root (the artifact root it lives under) or --tracking-uri")
    return MlflowClient(tracking_uri=uri)


def experiment_id(client: Any, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = ", ".join(sorted(e.name for e in client.search_experiments())) or "none"
        raise UserError(f"no MLflow experiment {name!r} at {redact(uri)} (experiments there: {known}); "
                        "pass --experiment")
    return exp.experiment_id


def select_runs(client: Any, exp_id: str, selectors: Sequence[str], fill_to: int = 0) -> list[Any]:
    """The runs `selectors` name (ids, or names in the experiment), then the
    experiment's newest training runs until there are `fill_to`; an unknown
    selector is an error naming every unknown one."""
    runs, unknown = [], []
    for selector in dict.fromkeys(s.strip() for s in selectors if s.strip()):
        run = _by_id(client, selector) or _by_name(client, exp_id, selector)
        if run is None:
            unknown.append(selector)
        else:
            runs.append(run)
    if unknown:
        newest = ", ".join(f"{r.info.run_name} ({r.info.run_id})" for r in newest_training_runs(client, exp_id, 5))
        raise UserError(f"no MLflow run with the id or name {', '.join(map(repr, unknown))} in experiment "
                        f"{client.get_experiment(exp_id).name!r} (its newest training runs: {newest or 'none'}); "
                        "pass ids or names from the MLflow UI")
    taken = {r.info.run_id for r in runs}
    if len(runs) < fill_to:
        more = [r for r in newest_training_runs(client, exp_id, fill_to + len(taken)) if r.info.run_id not in taken]
        runs += more[:fill_to - len(runs)]
    return list({r.info.run_id: r for r in runs}.values())


def newest_training_runs(client: Any, exp_id: str, count: int) -> list[Any]:
    return client.search_runs([exp_id], "tags.stage = 'train'", order_by=_NEWEST_FIRST, max_results=max(count, 1))


def _by_id(client: Any, selector: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    if not _RUN_ID.match(selector):
        return None
    try:
        return client.get_run(selector)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return None


def _by_name(client: Any, exp_id: str, name: str) -> Any | None:
    """The newest run of that name, training runs first: a `--fresh` restart
    or a second root makes a new MLflow run under the same name."""
    quote = '"' if "'" in name else "'"
    if quote in name:
        raise UserError(f"run name {name!r} holds both kinds of quote; pass its run id instead")
    found = client.search_runs([exp_id], f"attributes.run_name = {quote}{name}{quote}", order_by=_NEWEST_FIRST)
    found.sort(key=lambda r: r.data.tags.get("stage") != "train")  # stable: newest first within each
    if len(found) > 1:
        log.warning("run name %s matches %d runs; drawing %s (pass an id for another: %s)", name, len(found),
                    found[0].info.run_id, ", ".join(r.info.run_id for r in found[1:]))
    return found[0] if found else None


def read_curves(client: Any, run: Any) -> RunCurves:
    """What the figure needs of one run: tokens per step, the panels' metric histories (CORE's
    where it scored CORE in the loop), and the scores of the evaluate runs of its checkpoints."""
    params, per_step = run.data.params, run.data.params.get(TOKENS_PARAM)
    metrics = [*(p.metric for p in PANELS), CORE_SCORE, CORE_STDERR]
    series = {m: _history(client, run.info.run_id, m) for m in metrics if m in run.data.metrics}
    scored, cut = (_evaluated(client, run) if per_step else {}).get, params.get("eval.max_per_task", "None")
    return RunCurves(run.info.run_id, run.info.run_name, int(per_step) if per_step and per_step.isdigit() else None,
                     series, _points(scored(HELLASWAG)), run.data.tags.get("stage"),
                     _hellaswag_note(params), _spike_events(client, run), dataset_of(params),
                     hellaswag_sample=params.get("eval.hellaswag_source", "").startswith("builtin:"),
                     hellaswag_items=hellaswag_items(params), evaluated_stderr=_errors(scored(HELLASWAG)),
                     core_evaluated=_points(scored(CORE_SCORE)), core_evaluated_stderr=_errors(scored(CORE_SCORE)),
                     size=gpt2_size(params), core_note=f"≤{cut} items per task" if cut.isdigit() else None)


def _points(scores: dict[int, tuple[float, float | None]] | None) -> list[tuple[int, float]]:
    return [(step, value) for step, (value, _) in (scores or {}).items()]


def _errors(scores: dict[int, tuple[float, float | None]] | None) -> dict[int, float]:
    return {step: err for step, (_, err) in (scores or {}).items() if err is not None}


def _spike_events(client: Any, run: Any) -> dict[str, list[int]]:
    """The run's loss-spike events by kind: their steps, each (step, value)
    once: a trainer killed before it recorded a rollback meets the same spike
    again after its restart and logs it a second time."""
    events = {}
    for metric, kind in SPIKE_EVENTS.items():
        if metric in run.data.metrics:
            seen = {(m.step, m.value) for m in client.get_metric_history(run.info.run_id, metric)}
            events[kind] = sorted(step for step, _ in seen)
    return events


def _hellaswag_note(params: dict[str, str]) -> str | None:
    """What sets the run's HellaSwag apart from the full benchmark the
    reference was measured on, from its eval settings (None: nothing known
    does). A `builtin:` source (a sample written for tests: smoke's) is drawn
    on a panel of its own, which says so; another file is named."""
    source, limit = params.get("eval.hellaswag_source", ""), params.get("eval.limit", "None")
    notes = [] if source in HUB_SOURCES or source.startswith("builtin:") or not source else [f"{source}, not the hub's"]
    notes += [f"first {limit} items"] if limit.isdigit() else []
    return "; ".join(notes) or None


def hellaswag_items(params: dict[str, str]) -> int | None:
    """How many items the run's in-loop HellaSwag scores (the standard error of
    its points), where the source says: the hub's validation split or the
    built-in format sample, each cut to eval.limit; None for another file."""
    source, limit = params.get("eval.hellaswag_source", ""), params.get("eval.limit", "None")
    if source in HUB_SOURCES:
        total = HELLASWAG_ITEMS
    elif source == FORMAT_SAMPLE:
        total = _format_sample_items()
    else:
        return None
    return min(total, int(limit)) if limit.isdigit() else total


def _format_sample_items() -> int:
    """Rows of the shipped format sample (gpt2/eval/hellaswag/format_sample.jsonl), read without importing its package."""
    from importlib.util import find_spec

    folder = Path(find_spec("gpt2.eval.hellaswag").submodule_search_locations[0])
    return sum(1 for row in (folder / "format_sample.jsonl").read_text(encoding="utf-8").splitlines() if row.strip())


def _history(client: Any, run_id: str, metric: str) -> list[tuple[int, float]]:
    """One value per step, the last logged: a resumed run logs again the steps
    it redoes after its checkpoint, and those are the run's curve now."""
    latest: dict[int, Any] = {}
    for m in client.get_metric_history(run_id, metric):
        if m.step not in latest or m.timestamp >= latest[m.step].timestamp:
            latest[m.step] = m
    return [(step, latest[step].value) for step in sorted(latest)]


def _evaluated(client: Any, run: Any) -> dict[str, dict[int, tuple[float, float | None]]]:
    """Per score of EVALUATED (lm-eval's HellaSwag acc_norm, CORE): its value and standard error
    (None where not logged) per evaluated step of this training run, steps ascending (the newest
    evaluate run per step that has it). An evaluate run names its checkpoint (tag
    `checkpoint`, …/runs/<run>/checkpoints/step_N): it must lie in this run's
    directory under this run's root, not merely under a run of the same name."""
    name, root = run.info.run_name, run.data.params.get(ROOT_PARAM)
    if "'" in name:  # not a name this pipeline gives; the filter below could not hold it
        return {}
    found = client.search_runs([run.info.experiment_id],
                               f"tags.stage = 'evaluate' and attributes.run_name LIKE 'eval-{name}-%'",
                               order_by=_NEWEST_FIRST)
    scores: dict[str, dict[int, tuple[float, float | None]]] = {metric: {} for metric, _ in EVALUATED}
    for ev in found:
        checkpoint, step, logged = ev.data.tags.get("checkpoint", ""), ev.data.tags.get("step", ""), ev.data.metrics
        run_dir = posixpath.dirname(posixpath.dirname(checkpoint.rstrip("/")))
        if step.isdigit() and _is_run_dir(run_dir, root, name):
            for metric, err in ((m, e) for m, e in EVALUATED if m in logged):
                scores[metric].setdefault(int(step), (logged[metric], logged.get(err)))
    return {metric: dict(sorted(by_step.items())) for metric, by_step in scores.items()}


def _is_run_dir(url: str, root: str | None, name: str) -> bool:
    """Whether `url` is the directory of run `name` under `root` (the root as
    the run logged it)."""
    if posixpath.basename(url) != name:
        return False
    if not root or url == layout.run_dir_under(root, name):
        return True
    # A relative local root (the default, file://./artifacts) was made absolute
    # in the working directory of each stage, which need not be this one's.
    path = root[len("file://"):] if root.startswith("file://") else root
    if "://" in path or path.startswith(("/", "~")):
        return False
    return url.startswith("file://") and url.endswith("/" + posixpath.normpath(posixpath.join(path, "runs", name)))


def report_data(client: Any, exp_id: str, selectors: Sequence[str], fill_to: int = 0) -> FigureData:
    """What the figure of the runs `select_runs` picks draws, and skips."""
    runs = select_runs(client, exp_id, selectors, fill_to)
    if not runs:
        raise UserError(f"no training runs in experiment {client.get_experiment(exp_id).name!r}: train one first "
                        "(gpt2 train), or name runs with --runs")
    return figure_data([read_curves(client, r) for r in runs])


def make_report(uri: str, experiment: str, selectors: Sequence[str], out: Path, fill_to: int = 0,
                parent_run_id: str | None = None) -> dict[str, Any]:
    """Draw `report_data` into `out`, log it to `parent_run_id` when given, and
    say what was drawn and skipped (the `--json` result)."""
    client = open_store(uri)
    exp_id = experiment_id(client, experiment, uri)
    if parent_run_id and _by_id(client, parent_run_id) is None:  # before the work, not after
        raise UserError(f"no MLflow run {parent_run_id!r} at {redact(uri)} to log the report to (--parent-run)")
    data = report_data(client, exp_id, selectors, fill_to)
    for skip in data.skipped:
        log.warning("%s", skip.describe())
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    draw_figure(data, out, caption=f"experiment {experiment} at {redact(uri)}, drawn {stamp}")
    if parent_run_id:
        client.log_artifact(parent_run_id, str(out))
    return summary(data, out, experiment, uri, parent_run_id)


def summary(data: FigureData, out: Path, experiment: str, uri: str, parent_run_id: str | None) -> dict[str, Any]:
    names = {line.run_id: line.name for line in data.lines}
    return {
        "path": str(out.resolve()),
        "experiment": experiment,
        "tracking_uri": redact(uri),
        "runs": [{"run_id": run_id, "name": names[run_id],
                  "panels": sorted({x.panel for x in data.lines if x.run_id == run_id}),
                  "spikes": data.spikes.get(run_id, {})}
                 for run_id in data.runs_drawn()],
        "skipped": [{"run_id": s.run_id, "name": s.name, "panel": s.panel, "reason": s.reason} for s in data.skipped],
        "lines": [{"panel": x.panel, "run_id": x.run_id, "label": x.label, "source": x.source, "points": len(x.tokens),
                   "last": [x.tokens[-1], x.values[-1]], "last_stderr": x.errors[-1] if x.errors else None}
                  for x in data.lines],
        "references": [{"panel": r.panel, "value": r.value, "label": r.label} for r in data.references],
        "parent_run_id": parent_run_id,
    }


def pipeline_report(parent: Tracker, experiment: str, training_run_id: str | None) -> dict[str, Any]:
    """The pipeline's own training run beside the experiment's newest ones,
    logged to its parent run as `report.png` (queued like its other artifacts)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = make_report(parent.uri, experiment, [training_run_id] if training_run_id else [],
                             Path(tmp) / "report.png", fill_to=DEFAULT_NEWEST)
        parent.log_artifact(Path(report["path"]))  # copied at once: the directory can go
    return report
