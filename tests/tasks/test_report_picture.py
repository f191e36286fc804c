"""report.png tells the truth, read back from the matplotlib Figure `gpt2 report`
draws from a real SQLite MLflow store (tests.gpt2.report.figure_checks): HellaSwag's
axis spans chance to above GPT-2's figure, its scores carry their standard
error, a score on the built-in format sample is never drawn against GPT-2's
benchmark line, and no legend covers data."""

from __future__ import annotations

import pytest
from matplotlib.container import ErrorbarContainer
from mlflow import MlflowClient

from gpt2.report.reference_lines import CHANCE, HELLASWAG_GPT2
from gpt2.tracking.store import default_tracking_uri
from tasks.runs_report import make_report
from tests.gpt2.report.figure_checks import (
    axes_with_label,
    horizontal_lines,
    legends,
    plotted_points,
    saved_figures,  # noqa: F401 - a fixture
)
from tests.gpt2.train.fixtures import tiny_config
from tests.tasks.tracked_runs import evaluate_run, training_run

HUB = {"eval.hellaswag_source": "hf://datasets/Rowan/hellaswag", "eval.limit": None}


def _report(tmp_path, runs: list[str], config) -> dict:
    return make_report(default_tracking_uri(config), "gpt2", runs, tmp_path / "report.png")


def _label(config, run_id: str, suffix: str = "") -> str:
    return MlflowClient(default_tracking_uri(config)).get_run(run_id).info.run_name + suffix


def test_the_hellaswag_axis_runs_from_chance_to_above_gpt2s_figure(tmp_path, saved_figures):
    # Scores from 30.5% to 34%, the range the axis used to zoom into.
    bench = tiny_config(tmp_path, **HUB)
    run = training_run(bench, {"val/loss": [(4, 9.0)], "hellaswag/acc_norm": [(4, 0.305), (8, 0.34)]})
    evaluate_run(bench, step=8, acc_norm=0.33, stderr=0.0047)
    _report(tmp_path, [run], bench)
    ax = axes_with_label(saved_figures[-1], HELLASWAG_GPT2.label)
    low, high = ax.get_ylim()
    assert low <= CHANCE and high > max(HELLASWAG_GPT2.value, 0.34 + 0.0047), (low, high)
    assert CHANCE in horizontal_lines(ax)  # the chance line is drawn, and named
    assert any(label.startswith("chance: 25%") for label in ax.get_legend_handles_labels()[1])


def test_hellaswag_scores_carry_their_standard_error(tmp_path, saved_figures):
    bench = tiny_config(tmp_path, **HUB)
    run = training_run(bench, {"val/loss": [(4, 9.0)], "hellaswag/acc_norm": [(4, 0.28), (8, 0.30)]})
    evaluate_run(bench, step=8, acc_norm=0.31, stderr=0.0046)
    _report(tmp_path, [run], bench)
    ax = axes_with_label(saved_figures[-1], HELLASWAG_GPT2.label)
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}
    # lm-eval's score: a star with bars of its acc_norm_stderr.
    [segment] = bars[_label(bench, run, " (lm-eval)")].lines[2][0].get_segments()
    assert segment[:, 1].tolist() == pytest.approx([0.31 - 0.0046, 0.31 + 0.0046])
    # In-loop points over the hub's 10,042 items: the same formula lm-eval uses.
    in_loop = bars[_label(bench, run)].lines[2][0].get_segments()
    assert [s[1, 1] - s[0, 1] for s in in_loop] == pytest.approx(
        [2 * (p * (1 - p) / 10_041) ** 0.5 for p in (0.28, 0.30)])


def test_a_score_on_the_format_sample_is_not_drawn_against_gpt2s_benchmark_line(tmp_path, saved_figures):
    smoke = tiny_config(tmp_path)  # smoke's eval: the built-in format sample
    run = training_run(smoke, {"val/loss": [(4, 9.0)], "hellaswag/acc_norm": [(8, 0.32)]})
    evaluate_run(smoke, step=8, acc_norm=0.32, stderr=0.0853)
    report = _report(tmp_path, [run], smoke)
    fig = saved_figures[-1]
    ax = axes_with_label(fig, _label(smoke, run), ending="(lm-eval)")  # where the run's lm-eval score is
    assert HELLASWAG_GPT2.value not in horizontal_lines(ax)
    assert all("GPT-2" not in label for label in ax.get_legend_handles_labels()[1])
    assert "not the benchmark" in ax.get_title()  # and the panel says why
    # Nowhere else either: the figure has no panel of the benchmark to put GPT-2's line on.
    assert all(HELLASWAG_GPT2.value not in horizontal_lines(other) for other in fig.axes)
    assert [r["value"] for r in report["references"]] == []


def test_no_legend_covers_data_with_several_runs(tmp_path, saved_figures):
    runs, configs = [], []
    for i, lr in enumerate((3e-3, 1e-3)):  # two benchmark runs, close together, right up to GPT-2's line
        config = tiny_config(tmp_path, **HUB, **{"train.lr": lr})
        scores = [(s, 0.25 + 0.06 * s / 40 - 0.004 * i) for s in range(0, 41, 2)]
        runs.append(training_run(config, {"val/loss": [(s, 11 - s / 5 + i / 10) for s in range(0, 41, 4)],
                                          "hellaswag/acc_norm": scores}))
        evaluate_run(config, step=40, acc_norm=0.31 - 0.004 * i, stderr=0.0046)
        configs.append(config)
    smoke = tiny_config(tmp_path, **{"train.lr": 1e-4})  # and a smoke run on the format sample
    runs.append(training_run(smoke, {"val/loss": [(4, 9.0), (8, 8.5)], "hellaswag/acc_norm": [(8, 0.29)]}))
    evaluate_run(smoke, step=8, acc_norm=0.32, stderr=0.0853)
    _report(tmp_path, runs, configs[0])
    fig = saved_figures[-1]
    boxes = [legend.get_window_extent() for legend in legends(fig)]
    assert boxes, "the figure has legends"
    for ax in fig.axes:
        points = plotted_points(ax)
        assert len(points)
        for box in boxes:
            covered = [(x, y) for x, y in points if box.contains(x, y)]
            assert not covered, f"a legend covers {len(covered)} point(s) of {ax.get_title()!r}"
