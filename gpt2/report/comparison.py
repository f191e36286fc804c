"""The figure that compares training runs (`gpt2 report`): validation loss and
HellaSwag acc_norm against tokens trained, a line per run, with published
GPT-2 124M numbers as horizontal reference lines: those published on the data
the runs trained on (gpt2.report.reference_lines). Runs that scored CORE (in the
loop, eval.core_every, or by the evaluate stage) get a CORE panel, against
GPT-2's published CORE for their model's size. The loss panel marks each
run's loss spikes that changed what it trained (gpt2.train.spikes): a dotted
vertical line where it rolled back, a cross on the axis where it skipped an
update. HellaSwag scores carry their standard error; a score on the built-in
format sample (a few items written to check the scorer) is drawn on a panel of
its own, never against GPT-2's benchmark figure. gpt2.report.figure draws it.

Pure: runs come in as plain data (`RunCurves`, read back from MLflow by
tasks.runs_report) and `figure_data` returns exactly what is drawn, per run
and panel, so tests check the series rather than pixels. A run that lacks what
a panel needs is named in `FigureData.skipped`, never drawn as an empty line.

    data = figure_data(runs)
    draw_figure(data, Path("report.png"), caption="experiment gpt2 at sqlite:///…")  # gpt2.report.figure
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from gpt2.errors import UserError
from gpt2.report.reference_lines import REFERENCES, Reference, references_for

# The metric names the trainer logs (gpt2.train.loop, gpt2.train.in_loop)
# and the evaluate stage logs for its lm-eval score (tasks.evaluate), at the step trained.
VAL_LOSS, HELLASWAG = "val/loss", "hellaswag/acc_norm"
SPIKE_EVENTS = {"spikes/skipped": "skipped", "spikes/rollback": "rollbacks", "spikes/warned": "warned"}
"""The trainer's spike metrics (logged at the spike's step) -> the kind of event."""
MARKED = ("skipped", "rollbacks")
"""The events drawn on the loss panel: those that changed what the run trained."""


@dataclass(frozen=True)
class Panel:
    key: str
    metric: str
    title: str
    percent: bool
    """acc_norm is logged as a fraction; the axis shows it in percent."""


PANELS = (Panel("val_loss", VAL_LOSS, "validation loss", percent=False),
          Panel("hellaswag", HELLASWAG, "HellaSwag acc_norm", percent=True))
"""The panels by metric: what is read of each run, and what a run lacking it is skipped on."""
SAMPLE = Panel("hellaswag_sample", HELLASWAG, "HellaSwag acc_norm: built-in format sample", percent=True)
"""Where scores on the built-in format sample go: apart from the benchmark and its GPT-2 line."""
CORE_SCORE, CORE_STDERR = "core/score", "core/stderr"  # in the loop (eval.core_every) and by the evaluate stage
CORE = Panel("core", CORE_SCORE, "CORE (DCLM's 22 tasks, centered accuracy)", percent=False)
"""Drawn when a run has CORE: an opt-in score, so a run without it is not listed as skipped on it."""


@dataclass(frozen=True)
class RunCurves:
    """One run as read back from tracking: what the figure needs of it."""

    run_id: str
    name: str
    tokens_per_step: int | None
    """train.total_batch_tokens; None when the run has no training params."""
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """metric name -> [(step, value)], one value per step, steps ascending."""
    evaluated: list[tuple[int, float]] = field(default_factory=list)
    """lm-eval's HellaSwag acc_norm of the run's evaluated checkpoints: [(step, value)]."""
    stage: str | None = None
    hellaswag_note: str | None = None
    """Set when its HellaSwag is not the full benchmark (another source, a
    limit): shown in the legend, since the reference line is the full one."""
    events: dict[str, list[int]] = field(default_factory=dict)
    """Loss spikes by kind (SPIKE_EVENTS' values) -> the steps they happened at."""
    dataset: str | None = None
    """The published dataset it trained on (gpt2.report.reference_lines.dataset_of): picks the
    loss reference lines; None: data no figure was published on, no loss line."""
    hellaswag_sample: bool = False
    """Scored on the built-in format sample: drawn on SAMPLE's panel, never against the benchmark's line."""
    hellaswag_items: int | None = None
    """Items its in-loop HellaSwag scores, where known: gives each point's standard error."""
    evaluated_stderr: dict[int, float] = field(default_factory=dict)
    """lm-eval's acc_norm_stderr of each evaluated step (as `evaluated`)."""
    core_evaluated: list[tuple[int, float]] = field(default_factory=list)
    """The evaluate stage's CORE of the run's evaluated checkpoints: [(step, score)]; its in-loop
    CORE (and core/stderr) are in `series`."""
    core_evaluated_stderr: dict[int, float] = field(default_factory=dict)
    size: str | None = None
    """The GPT-2 size its model is set beside on CORE (gpt2.report.reference_lines.gpt2_size)."""
    core_note: str | None = None
    """Set when its in-loop CORE scores a cut of each task (eval.max_per_task): shown in the legend."""


@dataclass(frozen=True)
class Line:
    panel: str
    run_id: str
    name: str
    label: str
    """The legend entry: the run's name (with its id's start where two runs share it)."""
    source: str
    """`train` (logged by the trainer) or `evaluate` (the evaluate stage's lm-eval score)."""
    tokens: tuple[int, ...]
    values: tuple[float, ...]
    errors: tuple[float, ...] = ()
    """One standard error per point (lm-eval's, or the same formula on the items scored); () unknown."""


@dataclass(frozen=True)
class Mark:
    """A loss-spike event of one run on the loss panel."""

    run_id: str
    kind: str
    """`skipped` or `rollbacks` (MARKED)."""
    tokens: int


@dataclass(frozen=True)
class Skip:
    run_id: str
    name: str
    panel: str | None
    """None: the whole run."""
    reason: str

    def describe(self) -> str:
        where = f" on the {self.panel} panel" if self.panel else ""
        return f"skipped run {self.name} ({self.run_id}){where}: {self.reason}"


@dataclass(frozen=True)
class FigureData:
    lines: tuple[Line, ...]
    skipped: tuple[Skip, ...]
    references: tuple[Reference, ...] = REFERENCES
    marks: tuple[Mark, ...] = ()
    spikes: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per run id: its spike events counted by kind (every kind of SPIKE_EVENTS)."""

    def runs_drawn(self) -> list[str]:
        """Run ids with at least one line, in the order given."""
        return list(dict.fromkeys(line.run_id for line in self.lines))

    def line(self, panel: str, run_id: str, source: str = "train") -> Line | None:
        return next((x for x in self.lines if (x.panel, x.run_id, x.source) == (panel, run_id, source)), None)

    def panels(self) -> list[Panel]:
        """The panels drawn: loss, the benchmark's HellaSwag (unless every HellaSwag
        score is on the format sample), the format sample's (when a run has one)."""
        sample = any(x.panel == SAMPLE.key for x in self.lines)
        benchmark = any(x.panel == PANELS[1].key for x in self.lines) or not sample
        shown = [PANELS[0], *([PANELS[1]] if benchmark else []), *([SAMPLE] if sample else [])]
        return shown + ([CORE] if any(x.panel == CORE.key for x in self.lines) else [])


class NothingToDraw(UserError):
    """None of the runs has a series any panel can draw."""


def figure_data(runs: Sequence[RunCurves]) -> FigureData:
    """The lines each panel draws and the runs (or panels of a run) skipped,
    with why; NothingToDraw when no run gives any line."""
    lines: list[Line] = []
    skipped: list[Skip] = []
    marks: list[Mark] = []
    labels = _labels(runs)
    for run in runs:
        if run.tokens_per_step is not None:
            marks += [Mark(run.run_id, kind, step * run.tokens_per_step)
                      for kind in MARKED for step in run.events.get(kind, [])]
        if run.tokens_per_step is None:
            skipped.append(Skip(run.run_id, run.name, None, (
                f"no train.total_batch_tokens param, so its steps cannot be placed on the tokens axis: "
                f"not a training run (stage {run.stage or 'unknown'}); name the training run instead")))
            continue
        for panel in PANELS:
            found = _panel_lines(run, panel, labels[run.run_id])
            if not found:
                skipped.append(Skip(run.run_id, run.name, panel.key, f"no {panel.metric} metric"
                                    + _MISSING_HINTS[panel.key]))
            lines += found
        lines += _core_lines(run, labels[run.run_id])
    if not lines:
        reasons = "; ".join(s.describe() for s in skipped) or "no runs given"
        raise NothingToDraw(f"nothing to draw: none of the runs has {VAL_LOSS} or {HELLASWAG} metrics ({reasons}). "
                            "Name training runs that logged a validation pass (--runs)")
    spikes = {r.run_id: {kind: len(r.events.get(kind, [])) for kind in SPIKE_EVENTS.values()} for r in runs}
    drawn = {line.run_id for line in lines}
    data = FigureData(tuple(lines), tuple(skipped), marks=tuple(marks), spikes=spikes)
    benchmark = PANELS[1] in data.panels()
    scored = {x.run_id for x in lines if x.panel == CORE.key}
    references = references_for((r.dataset for r in runs if r.run_id in drawn), hellaswag=benchmark,
                                core_sizes=(r.size or "124M" for r in runs if r.run_id in scored))
    return FigureData(tuple(lines), tuple(skipped), references, tuple(marks), spikes)


_MISSING_HINTS = {
    "val_loss": " (no validation pass logged yet: it runs every train.eval_every steps and at the last step)",
    "hellaswag": " (in-loop HellaSwag runs every eval.every_steps, 0 = off, and no evaluate run of this "
                 "training run was found)",
}


def _labels(runs: Sequence[RunCurves]) -> dict[str, str]:
    """Run names, with the id's start added where two runs share a name (a
    `--fresh` restart, the same config on two roots)."""
    names = [r.name for r in runs]
    return {r.run_id: r.name if names.count(r.name) == 1 else f"{r.name} ({r.run_id[:8]})" for r in runs}


def _panel_lines(run: RunCurves, panel: Panel, label: str) -> list[Line]:
    per_step = run.tokens_per_step or 0
    hellaswag = panel.metric == HELLASWAG
    if hellaswag and run.hellaswag_note:
        label = f"{label} [{run.hellaswag_note}]"
    key = SAMPLE.key if hellaswag and run.hellaswag_sample else panel.key
    found = []
    points = run.series.get(panel.metric) or []
    if points:
        errors = tuple(stderr(v, run.hellaswag_items) for _, v in points) if hellaswag and run.hellaswag_items else ()
        found.append(Line(key, run.run_id, run.name, label, "train", tuple(step * per_step for step, _ in points),
                          tuple(v for _, v in points), errors))
    if hellaswag and run.evaluated:
        known = all(step in run.evaluated_stderr for step, _ in run.evaluated)
        found.append(Line(key, run.run_id, run.name, f"{label} (lm-eval)", "evaluate",
                          tuple(step * per_step for step, _ in run.evaluated), tuple(v for _, v in run.evaluated),
                          tuple(run.evaluated_stderr[step] for step, _ in run.evaluated) if known else ()))
    return found


def _core_lines(run: RunCurves, label: str) -> list[Line]:
    """The run's in-loop CORE (with core/stderr where logged at each step) and the evaluate stage's."""
    per_step, found = run.tokens_per_step or 0, []
    points, errors = run.series.get(CORE_SCORE) or [], dict(run.series.get(CORE_STDERR) or [])
    if points:
        known = all(step in errors for step, _ in points)
        found.append(Line(CORE.key, run.run_id, run.name, f"{label} [{run.core_note}]" if run.core_note else label,
                          "train", tuple(step * per_step for step, _ in points), tuple(v for _, v in points),
                          tuple(errors[step] for step, _ in points) if known else ()))
    if run.core_evaluated:
        known = all(step in run.core_evaluated_stderr for step, _ in run.core_evaluated)
        found.append(Line(CORE.key, run.run_id, run.name, f"{label} (evaluate)", "evaluate",
                          tuple(step * per_step for step, _ in run.core_evaluated),
                          tuple(v for _, v in run.core_evaluated),
                          tuple(run.core_evaluated_stderr[s] for s, _ in run.core_evaluated) if known else ()))
    return found


def stderr(accuracy: float, items: int) -> float:
    """The standard error of an accuracy over `items` items, as lm-eval reports
    it (the sample standard deviation of the 0/1 scores over sqrt(items))."""
    return math.sqrt(accuracy * (1 - accuracy) / (items - 1)) if items > 1 else 0.0


def tokens_label(tokens: float, _pos: object = None) -> str:
    """Tick labels as people say token counts: 512, 64K, 10M, 10B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(tokens) >= scale:
            return f"{tokens / scale:.3g}{suffix}"
    return f"{tokens:.3g}"
