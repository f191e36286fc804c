"""`gpt2 report` as its own process, through the console script's entry point
(`python -m cli.main`), on a real SQLite MLflow store found from `--root` as
every stage finds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from gpt2.tracking.store import default_tracking_uri
from tests.gpt2.train.fixtures import tiny_config
from tests.tasks.tracked_runs import training_run

# One pytest worker runs this module (--dist loadgroup): its module-scoped fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("report_command")


def gpt2_report(root, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the store under --root
    return subprocess.run([sys.executable, "-m", "cli.main", "report", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    a, b, c = (tiny_config(root, **{"train.lr": lr}) for lr in (3e-3, 1e-3, 1e-4))
    ids = [training_run(a, {"val/loss": [(4, 9.5), (8, 8.5)], "hellaswag/acc_norm": [(8, 0.26)]}),
           training_run(b, {"val/loss": [(4, 9.0)], "hellaswag/acc_norm": [(4, 0.27)]}),
           training_run(c, {"train/loss": [(1, 10.9)]})]
    client = MlflowClient(default_tracking_uri(a))
    names = [client.get_run(i).info.run_name for i in ids]
    return SimpleNamespace(root=root, ids=ids, names=names)


def test_report_draws_the_runs_named_and_names_the_one_skipped(store, tmp_path):
    a, b, c = store.ids
    out = tmp_path / "compare.png"
    # By name and by id, comma-separated and repeated.
    done = gpt2_report(store.root, "--runs", f"{store.names[0]},{b}", "--runs", c, "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["path"] == str(out) and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # tiny_config scores smoke's built-in format sample: its HellaSwag has a panel of its own.
    assert [(r["run_id"], r["panels"]) for r in result["runs"]] == [(a, ["hellaswag_sample", "val_loss"]),
                                                                     (b, ["hellaswag_sample", "val_loss"])]
    assert [(s["run_id"], s["panel"]) for s in result["skipped"]] == [(c, "val_loss"), (c, "hellaswag")]
    assert f"skipped run {store.names[2]} ({c}) on the val_loss panel: no val/loss metric" in done.stderr
    loss_a = next(x for x in result["lines"] if (x["run_id"], x["panel"]) == (a, "val_loss"))
    assert loss_a["points"] == 2 and loss_a["last"] == [8 * 256, 8.5]
    # No loss was published on smoke's data, and the format sample is not drawn against GPT-2's benchmark.
    assert result["references"] == []


def test_without_runs_the_newest_training_runs_are_drawn(store, tmp_path):
    done = gpt2_report(store.root, "--newest", "2", "--out", str(tmp_path / "r.png"))
    assert done.returncode == 0, done.stderr
    # The newest two are c (nothing to draw: skipped) and b.
    assert done.stdout.startswith(f"report: {tmp_path / 'r.png'}") and store.names[1] in done.stdout
    assert store.names[0] not in done.stdout and f"skipped run {store.names[2]}" in done.stderr


@pytest.mark.parametrize("runs, expected", [
    (lambda s: s.ids[2], lambda s: ["error: nothing to draw", s.ids[2], s.names[2]]),
    (lambda s: "no-such-run",
     lambda s: ["error: no MLflow run with the id or name 'no-such-run' in experiment 'gpt2'", s.names[1]]),
], ids=["nothing-to-draw", "unknown-run"])
def test_an_error_names_the_runs_and_exits_1(store, tmp_path, runs, expected):
    out = tmp_path / "r.png"
    done = gpt2_report(store.root, "--runs", runs(store), "--out", str(out), "--json")
    assert done.returncode == 1 and done.stdout == ""
    assert all(text in done.stderr for text in expected(store)), done.stderr
    assert not out.exists()
