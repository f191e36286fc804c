"""The MLflow link `gpt2 stack up` prints opens the experiment's runs table:
the experiment is made up front, as the stages would make it, so a fresh
browser lands on the training runs in "Model training" mode rather than in MLflow 3.17's GenAI mode."""

from __future__ import annotations

import socket
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from cli.stack import commands
from cli.stack.commands import _runs_page
from gpt2.config.runtime import RuntimeConfig
from gpt2.config.tree import Config
from gpt2.root import layout
from gpt2.tracking.experiment import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, UI_MODE_QUERY


def test_the_stack_link_opens_the_runs_table_of_the_experiment_the_stages_use(tmp_path, monkeypatch):
    # A new SQLite store's first use migrates MLflow's schema: seconds of CPU, more on a loaded machine
    # than `up`'s 15 s wait (which is for a server that never answers, tested below).
    monkeypatch.setattr(commands, "LINK_LOOKUP_S", 600)
    store, root = f"sqlite:///{tmp_path / 'mlflow.db'}", (tmp_path / "root").as_uri()
    link = _runs_page(store, root)
    config = Config(runtime=RuntimeConfig(root=root))
    exp = MlflowClient(store).get_experiment_by_name(config.tracking.experiment)
    assert link.endswith(f"/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning")
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert exp.artifact_location == layout.mlflow_artifacts(config)  # where the stages would have put it
    assert _runs_page(store, root) == link  # asked again: the same experiment, not a second one


def test_an_unreachable_mlflow_leaves_the_bare_address(tmp_path, monkeypatch):
    """The stack's MLflow server not answering (a closed port: what `up` meets).
    Not a broken SQLite URI: MLflow retries building such a store for minutes
    inside its process-wide store lock, which stalled every later MLflow use
    of the test worker (a data-flow test took 86 s instead of 14)."""
    monkeypatch.setattr(commands, "LINK_LOOKUP_S", 0.5)  # MLflow's client would retry for minutes
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # and its thread, left behind, ends at once
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing answers there
    bad = f"http://127.0.0.1:{port}"
    assert _runs_page(bad, (tmp_path / "root").as_uri()) == bad


def test_the_mlflow_ui_installed_reads_its_mode_from_the_links_workflow_type():
    """What gpt2.tracking.experiment.UI_MODE_QUERY relies on, read from the UI MLflow ships (its JavaScript
    bundle): the mode comes from the page's `workflowType` parameter, else the browser's stored
    choice, GenAI by default. A release that changes this fails here, not in a user's browser."""
    bundles = sorted((Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js").glob("*.js"))
    if not bundles:
        pytest.skip("this MLflow ships no UI (mlflow-skinny)")
    texts = [b.read_text(encoding="utf-8") for b in bundles]
    [mode] = [text for text in texts if '"mlflow.workflowType"' in text]
    key, value = UI_MODE_QUERY.split("=")
    assert f'get("{key}")' in mode and f'MACHINE_LEARNING="{value}"' in mode and 'GENAI="genai"' in mode
