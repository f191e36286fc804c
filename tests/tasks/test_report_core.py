"""CORE in the runs report, from a real SQLite MLflow store holding runs as the stages log them: a
run that scored CORE in the loop (eval.core_every) and whose last checkpoint the evaluate stage
scored on CORE gets a CORE panel against GPT-2's published CORE for its model's size, a line that
names its source; a run without CORE is drawn as before and not listed as skipped on it. Read
back from the figure's data and its matplotlib Figure (tests.gpt2.report.figure_checks)."""

from __future__ import annotations

import pytest
from matplotlib.container import ErrorbarContainer
from mlflow import MlflowClient

from gpt2.checkpoint.ref import CheckpointRef
from gpt2.report.reference_lines import core_reference
from gpt2.root import layout
from gpt2.tracking.store import default_tracking_uri
from tasks.runs_report import experiment_id, make_report, open_store, report_data
from tasks.tracking import checkpoint_tags, stage_run
from tests.gpt2.report.figure_checks import (
    axes_with_label,
    horizontal_lines,
    saved_figures,  # noqa: F401 - a fixture
)
from tests.gpt2.train.fixtures import tiny_config
from tests.tasks.tracked_runs import training_run

IN_LOOP = {"core/score": [(3, -0.02), (6, 0.01), (8, 0.03)], "core/stderr": [(3, 0.04), (6, 0.04), (8, 0.05)],
           "core/animal_mc/acc": [(8, 0.5)]}


def core_evaluate_run(config, step: int, score: float, stderr: float) -> str:
    """The evaluate stage's run of a checkpoint scored with eval.tasks=core: CORE only, no HellaSwag."""
    ref = CheckpointRef(layout.checkpoint_dir(layout.run_dir(config), step), step, "0" * 64)
    with stage_run(config, f"eval-{ref.run_name}-{ref.step_name}", "evaluate", tags=checkpoint_tags(ref)) as tracker:
        tracker.log_metrics({"core/score": score, "core/stderr": stderr, "core/animal_mc/centered": 0.1}, step=step)
    return tracker.run_id


def test_core_is_drawn_against_gpt2s_published_core_and_a_run_without_it_as_before(tmp_path, saved_figures):
    scored = tiny_config(tmp_path, **{"eval.core_every": 3, "eval.max_per_task": 4})
    plain = tiny_config(tmp_path, **{"train.lr": 1e-4})
    a = training_run(scored, {"val/loss": [(4, 9.0), (8, 8.5)], **IN_LOOP})
    core_evaluate_run(scored, step=8, score=0.04, stderr=0.06)
    b = training_run(plain, {"val/loss": [(4, 9.5), (8, 9.0)], "hellaswag/acc_norm": [(8, 0.3)]})
    uri = default_tracking_uri(scored)
    client = open_store(uri)
    data = report_data(client, experiment_id(client, "gpt2", uri), [a, b])
    per_step = scored.train.total_batch_tokens

    in_loop = data.line("core", a)
    assert in_loop.tokens == (3 * per_step, 6 * per_step, 8 * per_step)
    assert in_loop.values == (-0.02, 0.01, 0.03) and in_loop.errors == (0.04, 0.04, 0.05)
    assert in_loop.label.endswith("[≤4 items per task]")  # subsampled: said in the legend
    evaluated = data.line("core", a, source="evaluate")
    assert (evaluated.tokens, evaluated.values, evaluated.errors) == ((8 * per_step,), (0.04,), (0.06,))
    # A CORE-only evaluation brings no HellaSwag point.
    assert data.line("hellaswag_sample", a, source="evaluate") is None
    # smoke's tiny model is set beside the smallest GPT-2; the line names where the number comes from.
    [core_line] = [r for r in data.references if r.panel == "core"]
    assert core_line.value == 0.1139 and "124M" in core_line.label and "nanochat dev/LEADERBOARD.md" in core_line.label
    # The run without CORE: as before, nothing on the CORE panel, not skipped on it.
    assert data.line("core", b) is None and data.line("val_loss", b).values == (9.5, 9.0)
    assert all(s.panel != "core" for s in data.skipped)
    assert [p.key for p in data.panels()] == ["val_loss", "hellaswag_sample", "core"]

    report = make_report(uri, "gpt2", [a, b], tmp_path / "report.png")
    assert {"panel": "core", "value": 0.1139, "label": core_line.label} in report["references"]
    assert [r["panels"] for r in report["runs"]] == [["core", "val_loss"], ["hellaswag_sample", "val_loss"]]
    ax = axes_with_label(saved_figures[-1], core_line.label)
    assert {0.1139, 0.0} <= set(horizontal_lines(ax))  # GPT-2's CORE and chance (every task is centered)
    low, high = ax.get_ylim()
    assert low < -0.02 - 0.04 and high > 0.04 + 0.06  # every error bar in view
    name = MlflowClient(uri).get_run(a).info.run_name
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}
    [segment] = bars[f"{name} (evaluate)"].lines[2][0].get_segments()
    assert segment[:, 1].tolist() == pytest.approx([0.04 - 0.06, 0.04 + 0.06])
    assert [y for s in bars[in_loop.label].lines[2][0].get_segments() for y in s[:, 1]] == pytest.approx(
        [y for v, e in zip(in_loop.values, in_loop.errors) for y in (v - e, v + e)])


@pytest.mark.parametrize("shape, size", [((24, 1024, 16), "355M"), ((36, 1280, 20), "774M"), ((48, 1600, 25), "1.5B")])
def test_the_core_line_is_gpt2s_of_the_runs_size(tmp_path, shape, size):
    layers, width, heads = shape
    config = tiny_config(tmp_path, **{"model.n_layer": layers, "model.n_embd": width, "model.n_head": heads})
    run = training_run(config, {"val/loss": [(4, 9.0)], "core/score": [(4, 0.1)]})
    uri = default_tracking_uri(config)
    client = open_store(uri)
    data = report_data(client, experiment_id(client, "gpt2", uri), [run])
    assert [r for r in data.references if r.panel == "core"] == [core_reference(size)]
    assert core_reference(size).label.startswith(f"OpenAI GPT-2 {size}: ")
