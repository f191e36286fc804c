"""The runs report against a real SQLite MLflow store holding runs as the stages
log them: two training runs with validation loss and HellaSwag (one resumed,
one evaluated by the evaluate stage), and a third that never validated."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from gpt2.errors import UserError
from gpt2.report.comparison import NothingToDraw
from gpt2.tracking.store import default_tracking_uri
from gpt2.tracking.tracker import Tracker
from tasks import runs_report
from tasks.runs_report import _hellaswag_note, experiment_id, hellaswag_items, make_report, open_store, report_data
from tests.gpt2.train.fixtures import tiny_config
from tests.tasks.tracked_runs import evaluate_run, logged_again, training_run

# One pytest worker runs this module (--dist loadgroup): its module-scoped fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("runs_report")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    a, b, c = (tiny_config(root, **{"train.total_batch_tokens": tokens, "train.lr": lr})
               for tokens, lr in ((256, 3e-3), (512, 1e-3), (256, 1e-4)))
    a_id = training_run(a, {"val/loss": [(4, 9.5), (8, 8.5)], "hellaswag/acc_norm": [(4, 0.25), (8, 0.26)],
                            "spikes/skipped": [(3, 1.0)], "spikes/rollback": [(7, 6.0)]})
    # Step 8 logged again (a rollback redid it, or a release before resumed runs skipped the steps they
    # hold logged it), and the rollback at step 7 twice (killed before its record was written, it met the
    # same spike again).
    logged_again(a, a_id, {"val/loss": [(8, 8.25)], "hellaswag/acc_norm": [(8, 0.27)], "spikes/rollback": [(7, 6.0)]})
    b_id = training_run(b, {"val/loss": [(5, 9.0), (10, 8.0)], "hellaswag/acc_norm": [(10, 0.28)]})
    eval_id = evaluate_run(b, step=10, acc_norm=0.3, stderr=0.2)
    c_id = training_run(c, {"train/loss": [(1, 10.9), (2, 10.7)]})
    return SimpleNamespace(uri=default_tracking_uri(a), root=root, a=a_id, b=b_id, c=c_id, eval=eval_id,
                           config=a)


def _data(store, selectors, fill_to=0):
    client = open_store(store.uri)
    return report_data(client, experiment_id(client, "gpt2", store.uri), selectors, fill_to)


def test_two_runs_are_drawn_the_third_is_named_as_skipped(store, tmp_path):
    out = tmp_path / "report.png"
    report = make_report(store.uri, "gpt2", [store.a, store.b, store.c], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and report["path"] == str(out)
    data = _data(store, [store.a, store.b, store.c])
    # Tokens are steps x train.total_batch_tokens; a step logged again on resume counts once, as last logged.
    assert data.line("val_loss", store.a).tokens == (1024, 2048)
    assert data.line("val_loss", store.a).values == (9.5, 8.25)
    # tiny_config is smoke's: its HellaSwag is the format sample, drawn on a panel of its own (which says
    # what the sample is), 4 items of it (the legend says so).
    assert data.line("hellaswag_sample", store.a).values == (0.25, 0.27)
    assert (data.line("val_loss", store.b).tokens, data.line("val_loss", store.b).values) == ((2560, 5120), (9.0, 8.0))
    sample_b = data.line("hellaswag_sample", store.b)
    assert (sample_b.tokens, sample_b.values) == ((5120,), (0.28,))
    # The evaluate stage's lm-eval score of B's step-10 checkpoint, at the tokens B had trained, with its stderr.
    final = data.line("hellaswag_sample", store.b, source="evaluate")
    assert (final.tokens, final.values, final.errors) == ((5120,), (0.3,), (0.2,))
    assert data.line("hellaswag_sample", store.a, source="evaluate") is None
    assert data.line("hellaswag", store.a) is None
    assert data.line("hellaswag_sample", store.a).label.endswith("[first 4 items]")
    # In-loop points: the standard error of an accuracy over the 4 items scored, as lm-eval computes it.
    assert sample_b.errors == (pytest.approx((0.28 * 0.72 / 3) ** 0.5),)
    assert "[" not in data.line("val_loss", store.a).label
    # The third run: named, on both panels, with what it lacks.
    assert [(s.run_id, s.panel) for s in data.skipped] == [(store.c, "val_loss"), (store.c, "hellaswag")]
    assert [r["run_id"] for r in report["runs"]] == [store.a, store.b]
    assert [x["last_stderr"] for x in report["lines"] if x["source"] == "evaluate"] == [0.2]
    assert {(s["run_id"], s["panel"]) for s in report["skipped"]} == {(store.c, "val_loss"), (store.c, "hellaswag")}
    assert all("val/loss" in s["reason"] or "hellaswag/acc_norm" in s["reason"] for s in report["skipped"])
    # Smoke's data (Python's docs) has no published loss (an OWT run's below), and a score on the format
    # sample is not drawn against GPT-2's benchmark figure: no reference line at all.
    assert report["references"] == []


def test_an_openwebtext_run_is_drawn_against_nanogpts_figures(tmp_path):
    owt = tiny_config(tmp_path, **{"data.name": "openwebtext"})  # its own store: the module's keeps its runs
    owt_id = training_run(owt, {"val/loss": [(4, 9.25)]})
    report = make_report(default_tracking_uri(owt), "gpt2", [owt_id], tmp_path / "owt.png")
    assert [(r["value"], r["label"]) for r in report["references"] if r["panel"] == "val_loss"] == [
        (2.85, "nanoGPT GPT-2 124M: ~2.85 (OpenWebText val; nanoGPT README)"),
        (3.12, "OpenAI GPT-2 124M: 3.12 (OpenWebText val; nanoGPT README baselines)")]


def test_runs_by_name_and_by_default_the_newest_training_runs(store):
    assert _data(store, [_name(store, store.b)]).runs_drawn() == [store.b]
    # No runs named: the newest training runs (the evaluate run is not one), newest first.
    newest = _data(store, [], fill_to=2)
    assert newest.runs_drawn() == [store.b] and [s.run_id for s in newest.skipped] == [store.c, store.c]
    # Named runs come first, then the newest others fill up to the count.
    assert _data(store, [store.a], fill_to=3).runs_drawn() == [store.a, store.b]


def test_unknown_runs_are_an_error_naming_them_and_an_evaluate_run_is_skipped_as_not_training(store):
    with pytest.raises(UserError, match="'no-such-run', '0{32}'"):
        _data(store, ["no-such-run", "0" * 32, store.a])
    data = _data(store, [store.eval, store.a])
    [skip] = data.skipped
    assert skip.run_id == store.eval and skip.panel is None and "stage evaluate" in skip.reason


def test_an_evaluate_run_counts_only_for_the_run_directory_it_evaluated(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("first", "later"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "first")
    # A relative root, as the default (file://./artifacts), and the same run on another root.
    here = tiny_config("file://./artifacts", **{"tracking.uri": uri, "runtime.work_dir": str(tmp_path / "work")})
    elsewhere = tiny_config(tmp_path / "elsewhere", **{"tracking.uri": uri})
    run_id = training_run(here, {"val/loss": [(8, 8.5)]})
    evaluate_run(here, step=8, acc_norm=0.3)
    evaluate_run(elsewhere, step=4, acc_norm=0.9)
    monkeypatch.chdir(tmp_path / "later")  # the report drawn from another directory
    final = _data(SimpleNamespace(uri=uri), [run_id]).line("hellaswag_sample", run_id, source="evaluate")
    assert (final.tokens, final.values) == ((8 * 256,), (0.3,))


def test_nothing_to_draw_is_an_error_naming_the_runs(store, tmp_path):
    out = tmp_path / "report.png"
    with pytest.raises(NothingToDraw) as err:
        make_report(store.uri, "gpt2", [store.c, store.eval], out)
    assert store.c in str(err.value) and _name(store, store.c) in str(err.value) and store.eval in str(err.value)
    assert not out.exists()


def test_the_png_is_logged_to_the_parent_run_given(store, tmp_path):
    with Tracker(store.config, "pipeline-smoke-test", tags={"stage": "pipeline"}) as parent:
        pass
    make_report(store.uri, "gpt2", [store.a], tmp_path / "compare.png", parent_run_id=parent.run_id)
    assert [a.path for a in MlflowClient(store.uri).list_artifacts(parent.run_id)] == ["compare.png"]
    with pytest.raises(UserError, match="--parent-run"):
        make_report(store.uri, "gpt2", [store.a], tmp_path / "never.png", parent_run_id="f" * 32)
    assert not (tmp_path / "never.png").exists()


def test_a_missing_store_or_experiment_is_an_error_that_says_where(tmp_path, store):
    missing = f"sqlite:///{tmp_path / 'nothing' / 'mlflow.db'}"
    with pytest.raises(UserError, match="no MLflow store at .*--root"):
        make_report(missing, "gpt2", [], tmp_path / "r.png")
    assert not (tmp_path / "nothing").exists()  # reading never creates a store
    with pytest.raises(UserError, match="no MLflow experiment 'gpt3' .*experiments there: .*gpt2"):
        make_report(store.uri, "gpt3", [], tmp_path / "r.png")


def test_a_limited_or_sample_hellaswag_is_noted_from_the_runs_eval_params():
    hub = "hf://datasets/Rowan/hellaswag"
    assert _hellaswag_note({"eval.hellaswag_source": hub, "eval.limit": "None"}) is None
    assert _hellaswag_note({"eval.hellaswag_source": hub, "eval.limit": "1000"}) == "first 1000 items"
    # The format sample's panel says what it is; the legend only how much of it.
    assert _hellaswag_note({"eval.hellaswag_source": "builtin:format-sample", "eval.limit": "8"}) == "first 8 items"
    assert _hellaswag_note({"eval.hellaswag_source": "gs://b/hs.jsonl", "eval.limit": "None"}) == (
        "gs://b/hs.jsonl, not the hub's")


def test_the_items_behind_an_in_loop_score_follow_the_source_and_limit():
    from gpt2.eval.hellaswag.items import FORMAT_SAMPLE as SAMPLE_SOURCE
    from gpt2.eval.hellaswag.items import HUB_SOURCES as HUB
    from gpt2.eval.hellaswag.items import load_rows

    assert (runs_report.HUB_SOURCES, runs_report.FORMAT_SAMPLE) == (HUB, SAMPLE_SOURCE)  # copied, kept equal
    sample = len(load_rows(SAMPLE_SOURCE))
    assert hellaswag_items({"eval.hellaswag_source": SAMPLE_SOURCE, "eval.limit": "None"}) == sample == 31
    assert hellaswag_items({"eval.hellaswag_source": SAMPLE_SOURCE, "eval.limit": "4"}) == 4
    assert hellaswag_items({"eval.hellaswag_source": HUB[1], "eval.limit": "None"}) == 10_042
    assert hellaswag_items({"eval.hellaswag_source": "gs://b/hs.jsonl", "eval.limit": "None"}) is None


def _name(store, run_id: str) -> str:
    return MlflowClient(store.uri).get_run(run_id).info.run_name


def test_loss_spikes_are_marked_on_the_loss_panel_and_counted_per_run(store, tmp_path):
    data = _data(store, [store.a, store.b])
    assert sorted((m.run_id, m.kind, m.tokens) for m in data.marks) == [
        (store.a, "rollbacks", 7 * 256), (store.a, "skipped", 3 * 256)]  # the rollback logged twice, drawn once
    report = make_report(store.uri, "gpt2", [store.a, store.b], tmp_path / "report.png")
    spikes = {r["run_id"]: r["spikes"] for r in report["runs"]}
    assert spikes == {store.a: {"skipped": 1, "rollbacks": 1, "warned": 0},
                      store.b: {"skipped": 0, "rollbacks": 0, "warned": 0}}
