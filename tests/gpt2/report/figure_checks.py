"""Reading a drawn runs report back through matplotlib's object model (no
pixels): the Figure `draw` saved, each panel's axes by what it shows, the
points of everything plotted in display coordinates, and each legend's box."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def saved_figures(monkeypatch) -> list:
    """Every matplotlib Figure saved while the test runs (gpt2.report.figure.draw_figure's PNG),
    laid out as saved, for window extents."""
    from matplotlib.figure import Figure

    saved = []
    savefig = Figure.savefig

    def keep(fig, *args, **kwargs):
        done = savefig(fig, *args, **kwargs)
        fig.canvas.draw()
        saved.append(fig)
        return done

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def axes_with_label(fig, label: str, ending: str | None = None):
    """The one axes holding an artist labelled `label` (a run's series, a
    reference), or with `ending`, labelled from `label` to `ending`."""
    def fits(text: str) -> bool:
        return text == label if ending is None else text.startswith(label) and text.endswith(ending)

    [ax] = [ax for ax in fig.axes if any(fits(text) for text in ax.get_legend_handles_labels()[1])]
    return ax


def horizontal_lines(ax) -> list[float]:
    """The y of every line drawn across the whole axes (axhline: a reference or chance)."""
    return [float(line.get_ydata()[0]) for line in ax.lines
            if len(set(line.get_ydata())) == 1 and list(line.get_xdata()) == [0, 1]]


def _dense(points: np.ndarray, per_segment: int = 40) -> np.ndarray:
    """A polyline's points with `per_segment` more between each pair, so a box
    sitting on a segment between two points is caught."""
    if len(points) < 2:
        return points
    steps = np.linspace(0, 1, per_segment, endpoint=False)[:, None]
    between = [a + steps * (b - a) for a, b in zip(points[:-1], points[1:])]
    return np.vstack([*between, points[-1:]])


def plotted_points(ax) -> np.ndarray:
    """Display coordinates of the data drawn in `ax` and inside it: lines (and
    what lies between their points), error bars, bands, markers."""
    found = []
    for line in ax.lines:
        xy = line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float))
        found.append(_dense(xy[np.isfinite(xy).all(axis=1)]))
    for collection in ax.collections:
        transform = collection.get_transform()
        for path in collection.get_paths():
            found.append(_dense(transform.transform(path.vertices)))
    points = np.vstack(found) if found else np.empty((0, 2))
    return points[[ax.bbox.contains(x, y) for x, y in points]] if len(points) else points


def legends(fig) -> list:
    return [*(ax.get_legend() for ax in fig.axes if ax.get_legend()), *fig.legends]
