"""The runs-comparison figure from plain data: the lines each panel draws (tokens
= step x tokens per step), what is skipped and why, the references, the PNG."""

from __future__ import annotations

import pytest

from gpt2.report.comparison import FigureData, NothingToDraw, RunCurves, figure_data, tokens_label
from gpt2.report.figure import draw_figure as draw
from gpt2.report.reference_lines import REFERENCES

A = RunCurves("a" * 32, "smoke-aaa", 256, {"val/loss": [(4, 9.5), (8, 8.25)], "hellaswag/acc_norm": [(8, 0.25)]},
              stage="train")
B = RunCurves("b" * 32, "smoke-bbb", 512, {"val/loss": [(5, 9.0)]}, evaluated=[(10, 0.3)], stage="train")
EVAL = RunCurves("e" * 32, "eval-smoke-bbb-step_000010", None, {"hellaswag/acc_norm": [(10, 0.3)]}, stage="evaluate")


def test_lines_are_tokens_against_values_per_run_and_panel():
    data = figure_data([A, B])
    a_loss = data.line("val_loss", A.run_id)
    assert (a_loss.tokens, a_loss.values, a_loss.label) == ((1024, 2048), (9.5, 8.25), "smoke-aaa")
    assert data.line("hellaswag", A.run_id).tokens == (2048,)
    assert data.line("val_loss", B.run_id).tokens == (2560,)
    # B's HellaSwag is the evaluate stage's lm-eval score only: drawn as its own series.
    assert data.line("hellaswag", B.run_id) is None
    final = data.line("hellaswag", B.run_id, source="evaluate")
    assert (final.tokens, final.values, final.label) == ((5120,), (0.3,), "smoke-bbb (lm-eval)")
    assert data.runs_drawn() == [A.run_id, B.run_id] and data.skipped == ()
    # Smoke runs train on Python's docs: no loss was published on them, so HellaSwag's line only.
    assert {(r.panel, r.value) for r in data.references} == {("hellaswag", 0.311)}


def test_the_loss_references_follow_each_runs_data():
    fineweb = RunCurves("h" * 32, "fineweb-run", 256, {"val/loss": [(4, 3.5)]}, stage="train", dataset="fineweb")
    owt = RunCurves("i" * 32, "owt-run", 256, {"val/loss": [(4, 3.0)]}, stage="train", dataset="openwebtext")
    loss = lambda data: {(r.value, r.label.split(" (")[1]) for r in data.references if r.panel == "val_loss"}
    assert loss(figure_data([fineweb])) == {(3.28, "FineWeb val, 10B tokens; llm.c #481)")}
    assert loss(figure_data([owt])) == {(2.85, "OpenWebText val; nanoGPT README)"),
                                        (3.12, "OpenWebText val; nanoGPT README baselines)")}
    both = figure_data([owt, fineweb, A])
    assert [r.value for r in both.references] == [2.85, 3.12, 3.28, 0.311]
    # A run that is skipped (nothing drawn) brings no line of its data.
    skipped = RunCurves("j" * 32, "owt-empty", 256, {"train/loss": [(1, 9.0)]}, stage="train", dataset="openwebtext")
    assert [r.value for r in figure_data([fineweb, skipped]).references] == [3.28, 0.311]


@pytest.mark.parametrize("preset, overrides, dataset", [
    ("gpt2-124m", {}, "fineweb"), ("gpt2-350m", {}, "fineweb"), ("gpt2-124m-owt", {}, "openwebtext"),
    ("gpt2-124m-owt", {"data.source_format": "nanogpt-bin", "data.source": "gs://b/owt/"}, "openwebtext"),
    ("gpt2-124m", {"data.name": "nanogpt_owt", "data.source_format": "nanogpt-bin", "data.source": "/data/owt"},
     None),
    ("smoke", {}, None),
])
def test_a_runs_dataset_is_read_from_its_logged_params(preset, overrides, dataset):
    from gpt2.config.overrides import resolve_config
    from gpt2.report.reference_lines import dataset_of
    from gpt2.tracking.tracker import flatten

    params = {k: str(v) for k, v in flatten(resolve_config(preset, overrides).model_dump(mode="json")).items()}
    assert dataset_of(params) == dataset


def test_a_run_without_a_panels_metric_is_skipped_on_that_panel_and_one_without_training_params_entirely():
    only_loss = RunCurves("c" * 32, "smoke-ccc", 256, {"val/loss": [(2, 10.0)]}, stage="train")
    data = figure_data([only_loss, EVAL])
    assert [(x.run_id, x.panel) for x in data.lines] == [(only_loss.run_id, "val_loss")]
    [panel_skip, run_skip] = data.skipped
    assert (panel_skip.run_id, panel_skip.panel) == (only_loss.run_id, "hellaswag")
    assert "hellaswag/acc_norm" in panel_skip.reason and "eval.every_steps" in panel_skip.reason
    assert (run_skip.run_id, run_skip.panel) == (EVAL.run_id, None)
    assert "train.total_batch_tokens" in run_skip.reason and "evaluate" in run_skip.reason
    assert run_skip.describe().startswith(f"skipped run {EVAL.name} ({EVAL.run_id}): ")


def test_runs_sharing_a_name_are_told_apart_by_their_id():
    again = RunCurves("d" * 32, A.name, 256, {"val/loss": [(4, 9.0)]}, stage="train")
    data = figure_data([A, again])
    assert data.line("val_loss", A.run_id).label == f"smoke-aaa ({'a' * 8})"
    assert data.line("val_loss", again.run_id).label == f"smoke-aaa ({'d' * 8})"


def test_a_hellaswag_that_is_not_the_full_benchmark_says_so_in_its_legend():
    sample = RunCurves("g" * 32, "smoke-ggg", 256, {"val/loss": [(4, 9.0)], "hellaswag/acc_norm": [(4, 0.3)]},
                       evaluated=[(4, 0.3)], hellaswag_note="first 100 items")
    data = figure_data([sample])
    assert data.line("hellaswag", sample.run_id).label == "smoke-ggg [first 100 items]"
    assert data.line("hellaswag", sample.run_id, source="evaluate").label == "smoke-ggg [first 100 items] (lm-eval)"
    assert data.line("val_loss", sample.run_id).label == "smoke-ggg"


def test_nothing_to_draw_names_every_run_and_why():
    empty = RunCurves("f" * 32, "smoke-fff", 256, {}, stage="train")
    with pytest.raises(NothingToDraw) as err:
        figure_data([empty, EVAL])
    message = str(err.value)
    assert "nothing to draw" in message and empty.run_id in message and EVAL.name in message
    assert "val/loss" in message and "train.total_batch_tokens" in message


def test_draw_writes_one_png_in_place(tmp_path):
    out = tmp_path / "sub" / "report.png"
    assert draw(figure_data([A, B]), out, caption="experiment gpt2") == out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert [p.name for p in out.parent.iterdir()] == ["report.png"]  # no partial file left beside it
    # A panel no run can fill is drawn with its reference and a note, not left out.
    draw(FigureData(figure_data([B]).lines[:1], (), REFERENCES), tmp_path / "loss-only.png")
    assert (tmp_path / "loss-only.png").stat().st_size > 10_000


@pytest.mark.parametrize("tokens, label", [(512, "512"), (65_536, "65.5K"), (10_000_000, "10M"),
                                           (9_999_220_736, "10B"), (0, "0")])
def test_token_ticks_read_as_people_say_them(tokens, label):
    assert tokens_label(tokens) == label


def test_every_reference_line_says_what_data_it_was_measured_on():
    from gpt2.report.reference_lines import HELLASWAG_GPT2, LOSS_REFERENCES

    measured_on = {"fineweb": "FineWeb val", "openwebtext": "OpenWebText val"}
    for dataset, references in LOSS_REFERENCES.items():
        assert all(measured_on[dataset] in r.label for r in references), references
    assert "HellaSwag validation, 10,042 items" in HELLASWAG_GPT2.label


def test_format_sample_scores_get_a_panel_of_their_own_and_the_benchmarks_line_goes_with_its_panel():
    sample = RunCurves("k" * 32, "smoke-kkk", 256, {"val/loss": [(4, 9.0)], "hellaswag/acc_norm": [(4, 0.3)]},
                       evaluated=[(4, 0.32)], stage="train", hellaswag_sample=True, hellaswag_items=31,
                       evaluated_stderr={4: 0.085})
    alone = figure_data([sample])
    assert [p.key for p in alone.panels()] == ["val_loss", "hellaswag_sample"]
    assert alone.line("hellaswag_sample", sample.run_id, source="evaluate").errors == (0.085,)
    assert alone.line("hellaswag_sample", sample.run_id).errors == (pytest.approx((0.3 * 0.7 / 30) ** 0.5),)
    assert alone.references == ()  # no panel of the benchmark: no GPT-2 line
    beside = figure_data([A, sample])  # A scored the benchmark: both panels, GPT-2's line on A's
    assert [p.key for p in beside.panels()] == ["val_loss", "hellaswag", "hellaswag_sample"]
    assert [r.panel for r in beside.references] == ["hellaswag"]
    # No HellaSwag at all: the benchmark's panel, empty but for its line, says what is missing.
    assert [p.key for p in figure_data([B]).panels()] == ["val_loss", "hellaswag"]


def test_the_hellaswag_axis_spans_chance_to_above_the_reference_and_every_error_bar():
    from gpt2.report.comparison import Line
    from gpt2.report.figure import hellaswag_limits
    from gpt2.report.reference_lines import HELLASWAG_GPT2

    zoomed = Line("hellaswag", "a" * 32, "a", "a", "evaluate", (1,), (0.322,), (0.085,))
    low, high = hellaswag_limits([zoomed], [HELLASWAG_GPT2])
    assert low <= 0.25 and high > 0.322 + 0.085
    below_chance = Line("hellaswag", "a" * 32, "a", "a", "train", (1, 2), (0.2, 0.24), ())
    low, high = hellaswag_limits([below_chance], [HELLASWAG_GPT2])
    assert low < 0.2 and high > HELLASWAG_GPT2.value
    assert hellaswag_limits([], [])[0] < 0.25 < hellaswag_limits([], [])[1]


@pytest.mark.parametrize("preset, size", [("gpt2-124m", "124M"), ("gpt2-350m", "355M"), ("gpt2-774m", "774M"),
                                          ("gpt2-1558m", "1.5B"), ("smoke", "124M")])
def test_a_runs_gpt2_size_for_core_is_read_from_its_logged_params(preset, size):
    from gpt2.config.overrides import resolve_config
    from gpt2.eval.core import GPT2_CORE
    from gpt2.report.reference_lines import core_reference, gpt2_size
    from gpt2.tracking.tracker import flatten

    params = {k: str(v) for k, v in flatten(resolve_config(preset, {}).model_dump(mode="json")).items()}
    assert gpt2_size(params) == size and core_reference(size).value == GPT2_CORE[size]
    assert gpt2_size({}) is None


def test_core_gets_a_panel_only_where_a_run_has_it_with_gpt2s_line_for_its_size():
    scored = RunCurves("m" * 32, "smoke-mmm", 256, {"val/loss": [(4, 9.0)], "core/score": [(4, 0.02), (8, 0.05)]},
                       core_evaluated=[(8, 0.06)], stage="train", size="355M", core_note="≤500 items per task")
    data = figure_data([A, scored])
    assert [p.key for p in data.panels()] == ["val_loss", "hellaswag", "core"]
    line = data.line("core", scored.run_id)
    assert (line.tokens, line.values, line.errors, line.label) == ((1024, 2048), (0.02, 0.05), (),
                                                                   "smoke-mmm [≤500 items per task]")
    assert data.line("core", scored.run_id, source="evaluate").values == (0.06,)
    assert [(r.panel, r.value) for r in data.references] == [("hellaswag", 0.311), ("core", 0.1849)]
    # A has no CORE: not skipped on it (only the CORE run is, on HellaSwag, which it lacks).
    assert [(s.run_id, s.panel) for s in data.skipped] == [(scored.run_id, "hellaswag")]
    assert [p.key for p in figure_data([A, B]).panels()] == ["val_loss", "hellaswag"]
