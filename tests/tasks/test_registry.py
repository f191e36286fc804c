"""Model registration is idempotent: a retry of the same export (after a crash
that lost the task's result) reuses its version; another export is a new one.
A real MLflow store (SQLite under the test's root) and a real tiny HF model."""

from __future__ import annotations

import pytest
import torch
from mlflow import MlflowClient

from gpt2.export.hf import write_hf_dir
from gpt2.model import GPT
from gpt2.tracking.store import default_tracking_uri, prepare_sqlite
from gpt2.tracking.tracker import Tracker
from tasks.registry import EXPORT_TAG, register_hf_model
from tests.gpt2.train.fixtures import tiny_config


def hf_dir(config, path, seed: int):
    torch.manual_seed(seed)
    return write_hf_dir(GPT(config.model).state_dict(), config.model, path)


@pytest.fixture
def setup(tmp_path):
    config = tiny_config(tmp_path)
    # The store as the first Tracker would make it (a migrated copy): a client opened on a missing
    # one would run MLflow's whole chain of migrations, ~3 s of CPU a test.
    uri = default_tracking_uri(config)
    prepare_sqlite(uri)
    return config, MlflowClient(uri), hf_dir(config, tmp_path / "a", 0)


def register(config, path, export_id: str, alias: str | None = "current") -> tuple[int, str]:
    """One attempt of the stage: its own MLflow run, as a retried task opens."""
    with Tracker(config, "export") as tracker:
        return register_hf_model(tracker, path, "tiny", alias, export_id=export_id), tracker.run_id


def test_a_retry_reuses_the_version_and_moves_the_alias_back(setup, tmp_path):
    config, client, first = setup
    v1, run1 = register(config, first, "a1")
    assert v1 == 1 and client.get_model_version("tiny", "1").tags[EXPORT_TAG] == "a1"

    other, _ = register(config, hf_dir(config, tmp_path / "b", 1), "b2")
    assert other == 2 and int(client.get_model_version_by_alias("tiny", "current").version) == 2

    # The retry of the first export: no new version, no second logged model,
    # and the alias points at its version again.
    again, run2 = register(config, first, "a1")
    assert again == 1 and run2 != run1
    assert sorted(int(v.version) for v in client.search_model_versions("name='tiny'")) == [1, 2]
    assert int(client.get_model_version_by_alias("tiny", "current").version) == 1
    experiment = client.get_experiment_by_name(config.tracking.experiment).experiment_id
    assert len(client.search_logged_models([experiment])) == 2


def test_without_an_alias_nothing_is_moved(setup):
    config, client, first = setup
    assert register(config, first, "a1", alias=None)[0] == 1
    assert register(config, first, "a1", alias=None)[0] == 1
    assert client.get_registered_model("tiny").aliases == {}
