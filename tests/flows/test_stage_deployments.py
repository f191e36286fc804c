"""Stage deployments: root and MLflow store pinned by the parent, never a pod's environment;
a stage that never starts fails the parent."""

from __future__ import annotations

import pytest

from flows.stages import TrackingNotShared, stage_overrides
from gpt2.config.overrides import resolve_config


def test_root_and_tracking_are_pinned_as_the_parent_resolved_them(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = resolve_config("smoke", {"train.max_steps": 3}, root=str(tmp_path / "root"))
    pinned = stage_overrides(config, {"train.max_steps": 3})
    assert pinned == {"train.max_steps": 3, "runtime.root": f"file://{tmp_path}/root",
                      "tracking.uri": f"sqlite:///{tmp_path}/root/mlflow.db"}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")  # set where the pipeline starts
    assert stage_overrides(config, {})["tracking.uri"] == "http://mlflow.internal:5000"


def test_a_tracking_uri_with_credentials_is_never_copied_into_stage_parameters(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://ops:hunter2-secret@mlflow.internal")
    config = resolve_config("smoke", {}, root=str(tmp_path / "root"))
    with pytest.raises(TrackingNotShared, match="carries credentials.*MLFLOW_TRACKING_USERNAME") as err:
        stage_overrides(config, {})
    assert "hunter2-secret" not in str(err.value)


def test_a_remote_root_with_a_local_store_fails_at_once(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = resolve_config("smoke", {}, root="gs://bucket/gpt2")
    with pytest.raises(TrackingNotShared, match="gs://bucket/gpt2 is remote.*set tracking.uri"):
        stage_overrides(config, {})
    server = resolve_config("smoke", {"tracking.uri": "http://mlflow:5000"}, root="gs://bucket/gpt2")
    assert stage_overrides(server, {})["tracking.uri"] == "http://mlflow:5000"
    off = resolve_config("smoke", {"tracking.enabled": False}, root="gs://bucket/gpt2")
    assert "tracking.uri" not in stage_overrides(off, {})


def test_a_stage_that_never_starts_fails_the_parent_saying_what_is_missing(prefect_server):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    from flows.stages import StageFailed, _wait_final

    @flow(name="never-picked-up")
    def nobody_runs_me() -> None:
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(nobody_runs_me, state=Scheduled())  # no worker will ever take it
    with pytest.raises(StageFailed, match="waited 1 s in Scheduled without starting.*prefect worker start"):
        _wait_final(run.id, start_timeout_s=1, poll_s=0.2)


def test_the_parent_notices_a_stage_that_ended_by_its_event_not_at_the_next_poll(prefect_server):
    """The wait reads the run again as soon as the server publishes its change (flows.run_events):
    with a poll of ten minutes, a run completed from elsewhere is still returned, woken by its events."""
    import threading

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running, Scheduled

    from flows import stages
    from flows.run_events import RunWakeup

    @flow(name="ended-elsewhere")
    def ended_elsewhere() -> None:
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(ended_elsewhere, state=Scheduled())
    wakes = []
    real_wait = RunWakeup.wait

    def counted_wait(self, seconds):
        woke = real_wait(self, seconds)
        wakes.append(woke)
        return woke

    def finish() -> None:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Running(), force=True)
            client.set_flow_run_state(run.id, Completed(), force=True)

    # Started once the wait is subscribed: its first wake says so (flows.run_events).
    started = threading.Timer(1.0, finish)
    RunWakeup.wait = counted_wait
    try:
        started.start()
        final = stages._wait_final(run.id, start_timeout_s=float("inf"), poll_s=600)
    finally:
        RunWakeup.wait = real_wait
        started.join()
    assert final.state.is_completed()
    assert wakes and all(wakes), wakes  # every wait ended by an event, none by the ten-minute poll


def test_without_events_the_wait_is_the_poll(prefect_server, monkeypatch):
    """A server that serves no events (here: an address where nothing answers) leaves the plain poll:
    `wait` times out instead of failing, and closing does not hang."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.run_events import RunWakeup

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with RunWakeup("00000000-0000-0000-0000-000000000000") as wake:
            assert wake.wait(0.5) is False
            assert wake.wait(0.5) is False
        assert wake.events == 0
