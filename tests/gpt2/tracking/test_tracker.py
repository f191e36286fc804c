"""The MLflow tracker: defaults, batching, resume of a run, outage and catch-up."""

from __future__ import annotations

import tempfile
import time

from mlflow import MlflowClient

from gpt2.tracking.experiment import ui_link
from gpt2.tracking.store import artifact_location, default_tracking_uri
from gpt2.tracking.tracker import Tracker, flatten, metric_name
from tests.gpt2.train.fixtures import tiny_config


def test_defaults_live_under_the_artifact_root(tmp_path):
    config = tiny_config(tmp_path)
    assert default_tracking_uri(config) == f"sqlite:///{tmp_path}/mlflow.db"
    assert artifact_location(config) == f"file://{tmp_path}/mlflow-artifacts"
    remote = tiny_config("gs://bucket/prefix", **{"runtime.work_dir": str(tmp_path / "w")})
    assert default_tracking_uri(remote) == f"sqlite:///{tmp_path}/w/mlflow.db"
    assert artifact_location(remote) == "gs://bucket/prefix/mlflow-artifacts"
    assert default_tracking_uri(tiny_config(tmp_path, **{"tracking.uri": "http://mlflow:5000"})) == "http://mlflow:5000"


def test_params_are_flat_and_metric_names_have_no_commas():
    assert flatten({"train": {"lr": 0.1, "betas": [0.9, 0.95]}, "preset": "smoke"}) == {
        "train.lr": "0.1", "train.betas": "[0.9, 0.95]", "preset": "smoke"}
    assert metric_name("hellaswag/acc_norm,none") == "hellaswag/acc_norm_none"


def test_reopening_a_run_continues_its_curves(tmp_path):
    config = tiny_config(tmp_path)
    with Tracker(config, "run-a", tags={"stage": "train"}) as first:
        first.log_params({"a": 1})
        first.log_metrics({"loss": 2.0}, step=1)
    with Tracker(config, "run-a", run_id=first.run_id) as again:
        again.log_params({"a": 1, "b": 2})
        again.log_metrics({"loss": 1.0}, step=2)
    client = MlflowClient(default_tracking_uri(config))
    run = client.get_run(first.run_id)
    assert run.data.params == {"a": "1", "b": "2"} and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, "loss")] == [(1, 2.0), (2, 1.0)]


def test_a_resumed_run_logs_each_redone_step_once(tmp_path):
    """A trainer killed at step 5 resumes from its checkpoint at step 3 and
    redoes steps 4 and 5: each step of each metric stays in the run once (the
    first attempt's values: the resume is exact), and the steps after go on."""
    config = tiny_config(tmp_path)
    with Tracker(config, "run-r") as first:
        for step in range(1, 6):
            first.log_metrics({"loss": 10.0 - step, "lr": 0.1}, step=step)
    with Tracker(config, "run-r", run_id=first.run_id) as again:
        for step in range(4, 9):
            again.log_metrics({"loss": 10.0 - step, "lr": 0.1}, step=step)
        again.log_metrics({"val": 1.5}, step=8)  # a metric the first attempt never logged
    client = MlflowClient(default_tracking_uri(config))
    for key in ("loss", "lr"):
        assert [m.step for m in client.get_metric_history(first.run_id, key)] == list(range(1, 9)), key
    assert [m.step for m in client.get_metric_history(first.run_id, "val")] == [8]


def test_parent_run_and_artifacts(tmp_path, monkeypatch):
    config = tiny_config(tmp_path)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with Tracker(config, "parent") as parent:
        assert list(temp.iterdir()) == []  # no artifact, no spool: a trainer killed here leaves nothing behind
    note = tmp_path / "note.txt"
    note.write_text("hello")
    with Tracker(config, "child", parent_run_id=parent.run_id) as child:
        child.log_artifact(note, "notes")
        assert [p.name[:14] for p in temp.iterdir()] == ["gpt2-tracking-"]  # the copy waits there
        note.unlink()  # queued artifacts are copied: deleting the original is fine
        child.log_dict({"x": 1}, "result.json")
        child.set_tags({"k": "v"})
    client = MlflowClient(default_tracking_uri(config))
    run = client.get_run(child.run_id)
    assert run.data.tags["mlflow.parentRunId"] == parent.run_id and run.data.tags["k"] == "v"
    assert {a.path for a in client.list_artifacts(child.run_id)} == {"notes", "result.json"}
    assert list(temp.iterdir()) == []  # the spool goes at close


def test_buffered_records_catch_up_after_an_outage(tmp_path, caplog):
    # The store's directory is blocked by a plain file: SQLite cannot open the
    # database, exactly as when a mounted volume is missing. Then it comes back.
    blocked = tmp_path / "tracking"
    blocked.write_text("not a directory")
    config = tiny_config(tmp_path, **{"tracking.uri": f"sqlite:///{blocked}/mlflow.db"})
    tracker = Tracker(config, "outage", flush_interval_s=0.2, connect_timeout_s=5)
    assert tracker.run_id is None
    for step in range(1, 6):
        tracker.log_metrics({"loss": 1.0 / step}, step=step)
    tracker.log_params({"lr": 0.1})
    assert not tracker.flush(timeout=1.0)
    assert "unavailable" in caplog.text

    blocked.unlink()
    blocked.mkdir()
    assert tracker.flush(timeout=60)
    assert tracker.run_id is not None
    tracker.close()
    assert "reachable again" in caplog.text
    client = MlflowClient(config.tracking.uri)
    assert [m.step for m in client.get_metric_history(tracker.run_id, "loss")] == [1, 2, 3, 4, 5]
    assert client.get_run(tracker.run_id).data.params == {"lr": "0.1"}


def test_disabled_tracker_does_nothing(tmp_path):
    config = tiny_config(tmp_path)
    with Tracker(config, "off", enabled=False) as t:
        t.log_metrics({"loss": 1.0}, step=1)
        t.log_params({"a": 1})
        assert t.flush(timeout=0.1)
    assert t.run_id is None and not (tmp_path / "mlflow.db").exists()


def test_the_experiment_opens_on_its_training_runs(tmp_path):
    config = tiny_config(tmp_path)
    with Tracker(config, "run-k"):
        pass
    exp = MlflowClient(default_tracking_uri(config)).get_experiment_by_name(config.tracking.experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_an_experiment_made_without_its_kind_gets_it(tmp_path):
    config = tiny_config(tmp_path)
    with Tracker(config, "run-j"):  # the store made as the stages make it; then an experiment by hand
        pass
    client = MlflowClient(default_tracking_uri(config))
    by_hand = client.create_experiment("by-hand", artifact_location=str(tmp_path / "elsewhere"))
    assert "mlflow.experimentKind" not in client.get_experiment(by_hand).tags
    with Tracker(tiny_config(tmp_path, **{"tracking.experiment": "by-hand"}), "run-k") as t:
        t.flush(timeout=30)
    assert t.experiment_id == by_hand
    assert client.get_experiment(by_hand).tags["mlflow.experimentKind"] == "custom_model_development"


def test_links_open_the_runs_table_or_the_run_itself(tmp_path):
    config = tiny_config(tmp_path)
    with Tracker(config, "run-l") as t:
        t.flush(timeout=30)
    run = MlflowClient(default_tracking_uri(config)).get_run(t.run_id)
    assert t.experiment_id == run.info.experiment_id
    # A SQLite store: where `mlflow ui` serves it; a server: its own address, never its password. Both in
    # "Model training" mode: MLflow 3.17's UI reads it from the link (a fresh browser opens GenAI mode).
    assert ui_link(t.uri, t.experiment_id, t.run_id) == (
        f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{t.run_id}?workflowType=machine_learning")
    server = "https://user:secret@mlflow.example.com/"
    expected = f"https://user:***@mlflow.example.com/#/experiments/{t.experiment_id}/runs?workflowType=machine_learning"
    assert ui_link(server, t.experiment_id) == expected
    with Tracker(config, "run-l", run_id=t.run_id) as again:  # a reopened run knows its experiment too
        again.flush(timeout=30)
    assert again.experiment_id == t.experiment_id


def test_messages_show_the_tracking_uri_redacted(tmp_path, monkeypatch):
    # $MLFLOW_TRACKING_URI is not validated like the config: it may carry a password.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:s3cr3t@mlflow.example.com")
    tracker = Tracker(tiny_config(tmp_path), "off", enabled=False)
    assert tracker.uri == "https://alice:s3cr3t@mlflow.example.com"
    assert tracker.safe_uri == "https://alice:***@mlflow.example.com"


def test_an_outage_warning_never_prints_the_uris_password(tmp_path, monkeypatch, caplog):
    # MLflow's REST errors quote the request URL, userinfo included.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:s3cr3t@127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    tracker = Tracker(tiny_config(tmp_path), "outage", flush_interval_s=0.2, connect_timeout_s=2)
    try:
        tracker.log_metrics({"loss": 1.0}, step=1)
        assert not tracker.flush(timeout=2.0)
        assert "unavailable" in caplog.text and "127.0.0.1" in caplog.text
        assert "s3cr3t" not in caplog.text and "s3cr3t" not in (tracker._outbox.outage or "")
    finally:
        # Its sender stops with the test (with MLflow's own retries back at their
        # default, a sender left running would log minutes after pytest ended).
        tracker.close()
    assert "s3cr3t" not in caplog.text


def test_a_tracker_whose_run_was_taken_over_sends_nothing_more(tmp_path):
    """A fenced trainer (another took its run over: gpt2.checkpoint.lease)
    closes with status None: what it had queued is dropped, not sent late on
    top of the steps the new trainer logs, and the run's status is left alone."""
    blocked = tmp_path / "tracking"
    blocked.write_text("not a directory")  # MLflow away while the old trainer queues steps 1-3
    config = tiny_config(tmp_path, **{"tracking.uri": f"sqlite:///{blocked}/mlflow.db"})
    old = Tracker(config, "run-t", flush_interval_s=0.2, connect_timeout_s=1)
    for step in range(1, 4):
        old.log_metrics({"loss": 9.0}, step=step)
    blocked.unlink()
    blocked.mkdir()  # MLflow back just as the old trainer learns it lost the run
    old.close(None)
    with Tracker(config, "run-t") as new:  # the trainer that took over logs those steps itself
        for step in range(1, 4):
            new.log_metrics({"loss": 1.0}, step=step)
    client = MlflowClient(config.tracking.uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    points = [(m.step, m.value) for r in runs for m in client.get_metric_history(r.info.run_id, "loss")]
    assert points == [(1, 1.0), (2, 1.0), (3, 1.0)]


def test_a_fenced_tracker_sends_nothing_once_its_lease_passed_to_another(tmp_path):
    """The trainer's lease check fences its MLflow sends too: a trainer that
    thaws after another took its run over must not send what it had queued
    (MLflow away), even before its loop notices: its sender checks first."""
    from gpt2.checkpoint.lease import Lease
    from gpt2.root import storage

    lease = Lease(f"file://{tmp_path}/lease", ttl_s=60)
    assert lease.try_acquire() is None  # generation 1
    config = tiny_config(tmp_path)
    tracker = Tracker(config, "run-f", flush_interval_s=0.2, fence=lease.still_held)
    tracker.log_metrics({"loss": 9.0}, step=1)
    assert tracker.flush(timeout=30)
    # Another trainer takes the run over (the next generation, as Lease.try_acquire writes it) ...
    storage.create_exclusive(f"file://{tmp_path}/lease/000002.json", b'{"holder": {}, "renewed_at": 0}')
    tracker.log_metrics({"loss": 8.0}, step=2)  # ... before this one's sender sends step 2
    time.sleep(1.0)
    tracker.close(None)
    history = MlflowClient(default_tracking_uri(config)).get_metric_history(tracker.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 9.0)]
