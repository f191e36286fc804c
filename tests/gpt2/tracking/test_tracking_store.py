"""New SQLite tracking stores start from a migrated empty copy (gpt2.tracking.store.seed_sqlite_store)."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from mlflow import MlflowClient

from gpt2.tracking.store import prepare_sqlite as _prepare_sqlite
from gpt2.tracking.store import seed_sqlite_store


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gpt2-pipeline"


def _tables(path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_a_new_store_is_a_migrated_copy_that_mlflow_opens_without_migrating(tmp_path, cache, caplog):
    uri = f"sqlite:///{tmp_path / 'root' / 'mlflow.db'}"
    _prepare_sqlite(uri)
    [template] = cache.glob("mlflow-*-empty.db")
    assert {"experiments", "runs", "metrics", "alembic_version"} <= _tables(tmp_path / "root" / "mlflow.db")
    caplog.set_level("INFO")
    caplog.clear()
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("x"))
    client.log_metric(run.info.run_id, "loss", 1.5, step=1)
    assert client.get_metric_history(run.info.run_id, "loss")[0].value == 1.5
    assert "Creating initial MLflow database tables" not in caplog.text  # MLflow found its schema current
    # The Default experiment is the store's own, made when it was first opened,
    # not the template's (which has no experiments at all).
    assert client.get_experiment("0").name == "Default"
    with sqlite3.connect(template) as db:
        assert db.execute("SELECT COUNT(*) FROM experiments").fetchone() == (0,)


def test_an_existing_store_is_never_replaced(tmp_path, cache):
    path = tmp_path / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    run = client.create_run(client.create_experiment("kept"))
    seed_sqlite_store(path)
    assert client.get_run(run.info.run_id).info.run_id == run.info.run_id
    assert not list(tmp_path.glob(".mlflow.db.*"))  # no seed copy left behind


def test_many_first_runs_at_once_each_get_one_working_store(tmp_path, cache):
    paths = [tmp_path / f"root{i % 2}" / "mlflow.db" for i in range(6)]  # three writers per store
    for p in paths:
        p.parent.mkdir(exist_ok=True)
    errors = []

    def seed(p):
        try:
            seed_sqlite_store(p)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=seed, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for p in set(paths):
        client = MlflowClient(tracking_uri=f"sqlite:///{p}")
        assert client.get_experiment_by_name("Default") is not None
        assert not list(p.parent.glob(".mlflow.db.*"))
    assert len(list(cache.glob("mlflow-*-empty.db"))) == 1
    assert not [p for p in cache.iterdir() if p.name.endswith((".new", ".seed"))]  # no half-made copy left


def test_a_cache_it_cannot_write_leaves_the_store_to_mlflow(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    path = tmp_path / "root" / "mlflow.db"
    _prepare_sqlite(f"sqlite:///{path}")
    assert not path.exists()  # nothing half-made: MLflow creates it on first use
    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    assert client.get_experiment("0").name == "Default"
