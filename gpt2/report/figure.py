"""Drawing the runs-comparison figure (gpt2.report.comparison says what is drawn):
one panel per entry of `FigureData.panels()`, a line per run, reference lines
that name the data they were measured on, HellaSwag with error bars of one
standard error and an axis from chance (25%) to above GPT-2's figure (CORE's
from chance, 0, to above GPT-2's CORE), and each panel's legend below it, where
it can cover no data.

    draw_figure(figure_data(runs), Path("report.png"), caption="experiment gpt2 at …")
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from gpt2.report.comparison import CORE, HELLASWAG, SAMPLE, VAL_LOSS, FigureData, Line, Panel, tokens_label
from gpt2.report.reference_lines import CHANCE, Reference

CHANCE_LABEL = f"chance: {CHANCE:.0%} (one of 4 endings)"
CORE_CHANCE_LABEL = "chance: 0 (each task centered on its random baseline)"
SAMPLE_WHY = ("a few items written to check the scorer, not the benchmark:\n"
              "no GPT-2 line, since its figure is measured on the benchmark")
_SPIKE_LABELS = {"rollbacks": "rollback (loss spike)", "skipped": "skipped update (loss spike)"}


def hellaswag_limits(lines: Sequence[Line], references: Sequence[Reference]) -> tuple[float, float]:
    """A HellaSwag axis from chance (or the lowest error bar below it) to above
    the reference lines and every error bar, with a margin: a score is read
    against chance and GPT-2's figure, not against a zoomed-in neighbour."""
    lows, highs = [CHANCE], [CHANCE, *(r.value for r in references)]
    for line in lines:
        errors = line.errors or (0.0,) * len(line.values)
        lows += [v - e for v, e in zip(line.values, errors)]
        highs += [v + e for v, e in zip(line.values, errors)]
    low, high = max(min(lows), 0.0), min(max(highs), 1.0)
    margin = max(0.08 * (high - low), 0.01)
    return max(low - margin, 0.0), min(high + margin, 1.0)


def core_limits(lines: Sequence[Line], references: Sequence[Reference]) -> tuple[float, float]:
    """A CORE axis from chance (0: every task is centered on its random baseline) or the lowest
    error bar below it, to above GPT-2's figure and every error bar, with a margin."""
    lows, highs = [0.0], [0.0, *(r.value for r in references)]
    for line in lines:
        errors = line.errors or (0.0,) * len(line.values)
        lows += [v - e for v, e in zip(line.values, errors)]
        highs += [v + e for v, e in zip(line.values, errors)]
    margin = max(0.08 * (max(highs) - min(lows)), 0.01)
    return min(lows) - margin, max(highs) + margin


def _draw_line(ax, line: Line, color: str) -> None:
    """A run's series: lm-eval's final scores as stars (single points, not a line
    between checkpoints), a few points with markers, many as a plain line; the
    standard error as bars on stars and markers, as a band along a plain line."""
    few = line.source == "evaluate" or len(line.tokens) <= 30
    if line.source == "evaluate":
        style = {"marker": "*", "markersize": 12, "linestyle": "none"}
    else:
        style = {"marker": "o" if few else None, "markersize": 3, "linewidth": 1.5}
    if line.errors and few:
        ax.errorbar(line.tokens, line.values, yerr=line.errors, color=color, label=line.label, elinewidth=1,
                    capsize=4 if line.source == "evaluate" else 2, **style)
        return
    ax.plot(line.tokens, line.values, color=color, label=line.label, **style)
    if line.errors:
        ax.fill_between(line.tokens, [v - e for v, e in zip(line.values, line.errors)],
                        [v + e for v, e in zip(line.values, line.errors)], color=color, alpha=0.2, linewidth=0)


def _draw_marks(ax, data: FigureData, colors: dict[str, str]) -> None:
    """Rollbacks as dotted vertical lines, skipped updates as crosses on the x axis."""
    labelled: set[str] = set()
    for mark in (m for m in data.marks if m.run_id in colors):
        label = _SPIKE_LABELS[mark.kind] if mark.kind not in labelled else None
        labelled.add(mark.kind)
        if mark.kind == "rollbacks":
            ax.axvline(mark.tokens, color=colors[mark.run_id], linestyle=":", linewidth=1.2, label=label)
        else:  # x in data, y in axes units: on the axis whatever the loss range
            ax.plot([mark.tokens], [0.02], marker="x", markersize=7, linestyle="none", color=colors[mark.run_id],
                    transform=ax.get_xaxis_transform(), label=label)


def _draw_panel(ax, panel: Panel, data: FigureData, colors: dict[str, str]) -> None:
    lines = [x for x in data.lines if x.panel == panel.key]
    references = [r for r in data.references if r.panel == panel.key]
    for line in lines:
        _draw_line(ax, line, colors[line.run_id])
    if not lines:
        ax.text(0.5, 0.5, f"no run has {panel.metric}", transform=ax.transAxes, ha="center", color="gray")
    if panel.metric == VAL_LOSS:
        _draw_marks(ax, data, colors)
    for ref in references:
        ax.axhline(ref.value, color="black", linestyle="--", linewidth=1, label=ref.label)
    ax.set_title(panel.title + (f"\n{SAMPLE_WHY}" if panel.key == SAMPLE.key else ""),
                 fontsize="medium" if panel.key == SAMPLE.key else "large")
    ax.set_xlabel("tokens trained")
    ax.xaxis.set_major_formatter(_formatter(tokens_label))
    if panel.metric == HELLASWAG:
        from matplotlib.ticker import PercentFormatter

        ax.axhline(CHANCE, color="gray", linestyle=":", linewidth=1, label=CHANCE_LABEL)
        ax.set_ylim(*hellaswag_limits(lines, references))
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        if any(x.errors for x in lines):
            ax.set_ylabel("acc_norm (bars, bands: ±1 standard error)")
    if panel.key == CORE.key:
        ax.axhline(0.0, color="gray", linestyle=":", linewidth=1, label=CORE_CHANCE_LABEL)
        ax.set_ylim(*core_limits(lines, references))
        ax.set_ylabel("CORE" + (" (bars, bands: ±1 standard error)" if any(x.errors for x in lines) else ""))
    ax.grid(alpha=0.3)
    # Below the axes (under the tick labels and the axis label), never over the data.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=3.9, fontsize="small", frameon=False)


def _formatter(func):
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(func)


def build_figure(data: FigureData, caption: str = ""):
    """The matplotlib Figure (on an Agg canvas, no pyplot): one axes per panel drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = data.panels()
    entries = max(len(ax_handles) for ax_handles in _legend_sizes(data, panels))
    # A Figure of its own on the Agg canvas: no pyplot, so no global backend or
    # figure registry is touched in the caller's process (a flow, a notebook).
    fig = Figure(figsize=(5.4 * len(panels), 4.6 + 0.2 * entries), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colors = {run_id: f"C{i % 10}" for i, run_id in enumerate(data.runs_drawn())}
    for ax, panel in zip(axes, panels):
        _draw_panel(ax, panel, data, colors)
    if caption:
        fig.get_layout_engine().set(rect=(0, 0.03, 1, 0.97))
        fig.text(0.01, 0.01, caption, fontsize="x-small", color="gray")
    return fig


def _legend_sizes(data: FigureData, panels: Sequence[Panel]) -> list[list[str]]:
    """Each panel's legend entries (to make the figure tall enough for the longest)."""
    sizes = []
    for panel in panels:
        entries = [x.label for x in data.lines if x.panel == panel.key]
        entries += [r.label for r in data.references if r.panel == panel.key]
        chance = {HELLASWAG: [CHANCE_LABEL], CORE.metric: [CORE_CHANCE_LABEL]}
        entries += chance.get(panel.metric, list({m.kind for m in data.marks}))
        sizes.append(entries)
    return sizes


def draw_figure(data: FigureData, path: Path, caption: str = "") -> Path:
    """The figure as one PNG at `path` (written whole, then renamed into place)."""
    fig = build_figure(data, caption)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    fig.savefig(partial, format="png", dpi=100)
    os.replace(partial, path)
    return path
