"""Automations in deployments/automations/: Prefect's own models accept them,
the server's trigger logic selects exactly the runs they are meant for, and on a
real server the reschedule automation puts a crashed preemptible run back to
Scheduled once it has stayed Crashed for a while."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.schemas.automations import AutomationCore
from prefect.server.events.schemas.automations import AutomationCore as ServerAutomationCore
from prefect.server.events.schemas.events import ReceivedEvent
from prefect.states import AwaitingRetry, Crashed, Pending, Running

from flows import deployment_file

RESCHEDULE, ZOMBIE = deployment_file.RESCHEDULE_AUTOMATION, deployment_file.ZOMBIE_AUTOMATION
CAP = deployment_file.RESCHEDULE_CAP_AUTOMATION


def _specs(max_reschedules: int = deployment_file.DEFAULT_MAX_RESCHEDULES) -> dict[str, dict]:
    return {spec["name"]: spec for spec in deployment_file.automations(max_reschedules)}


def _trigger(name: str, max_reschedules: int = deployment_file.DEFAULT_MAX_RESCHEDULES):
    return ServerAutomationCore.model_validate(_specs(max_reschedules)[name]).trigger


def _event(name: str, run_count: int | None = 1, tags: tuple[str, ...] = ("gpt2", "gpu", "preemptible")):
    """An event shaped like the server's flow-run state-change events."""
    resource = {"prefect.resource.id": f"prefect.flow-run.{uuid.uuid4()}", "prefect.resource.name": "gentle-gpt"}
    if run_count is not None:
        resource["prefect.run-count"] = str(run_count)
    related = [{"prefect.resource.id": f"prefect.tag.{t}", "prefect.resource.role": "tag"} for t in tags]
    return ReceivedEvent(occurred=datetime.now(timezone.utc), event=name, resource=resource, related=related,
                         id=uuid.uuid4())


def test_files_are_valid_automations_for_client_and_server():
    specs = _specs()
    assert set(specs) == {RESCHEDULE, ZOMBIE, CAP}
    for spec in specs.values():
        AutomationCore.model_validate(spec)
        ServerAutomationCore.model_validate(spec)
    reschedule = AutomationCore.model_validate(specs[RESCHEDULE]).actions[0]
    assert (reschedule.type, reschedule.state, reschedule.name) == (
        "change-flow-run-state", StateType.SCHEDULED, "AwaitingRetry")
    assert AutomationCore.model_validate(specs[ZOMBIE]).actions[0].state == StateType.CRASHED


def test_reschedule_covers_crashes_of_preemptible_runs_up_to_the_cap():
    trigger = _trigger(RESCHEDULE)
    # Waits until the run has stayed Crashed a while (a process worker reports a crash twice).
    assert trigger.posture == "Proactive" and trigger.starts_after("prefect.flow-run.Crashed")
    assert trigger.expects("prefect.flow-run.Crashed") and trigger.for_each == {"prefect.resource.id"}
    assert [trigger.covers(_event("prefect.flow-run.Crashed", n)) for n in range(5)] == [
        False, True, True, True, False]  # 0: never ran; 4: past the default cap of 3
    assert not trigger.covers(_event("prefect.flow-run.Crashed", tags=("gpt2",)))
    assert not trigger.starts_after("prefect.flow-run.Failed")  # a bug is not a preemption


def test_cap_is_a_setting():
    assert [_trigger(RESCHEDULE, 5).covers(_event("prefect.flow-run.Crashed", n)) for n in (5, 6)] == [True, False]
    off = _specs(0)[RESCHEDULE]
    assert not off["enabled"] and not _trigger(RESCHEDULE, 0).covers(_event("prefect.flow-run.Crashed", 1))
    with pytest.raises(ValueError):
        deployment_file.automations(-1)


def test_reschedule_wait_is_a_setting():
    assert _trigger(RESCHEDULE).within.total_seconds() == deployment_file.DEFAULT_RESCHEDULE_AFTER_S == 20
    spec = _specs_waiting(12)[RESCHEDULE]
    assert ServerAutomationCore.model_validate(spec).trigger.within.total_seconds() == 12
    with pytest.raises(ValueError, match="at least 10 s"):
        deployment_file.automations(reschedule_after_s=9)


def _specs_waiting(reschedule_after_s: int) -> dict[str, dict]:
    return {s["name"]: s for s in deployment_file.automations(reschedule_after_s=reschedule_after_s)}


def test_zombie_window_is_a_setting():
    assert _trigger(ZOMBIE).within.total_seconds() == deployment_file.DEFAULT_ZOMBIE_AFTER_S
    spec = {s["name"]: s for s in deployment_file.automations(zombie_after_s=600)}[ZOMBIE]
    assert ServerAutomationCore.model_validate(spec).trigger.within.total_seconds() == 600
    assert "600 s" in spec["actions"][0]["message"] and "600 s" in spec["description"]
    with pytest.raises(ValueError, match="at least 60 s"):
        deployment_file.automations(zombie_after_s=30)


def test_zombie_watch_covers_heartbeats_of_gpu_runs_and_the_parent_only():
    trigger = _trigger(ZOMBIE)
    assert trigger.posture == "Proactive" and trigger.for_each == {"prefect.resource.id"}
    assert trigger.starts_after("prefect.flow-run.heartbeat")
    # A run that dies between its Running state and its first beat is watched too.
    assert trigger.starts_after("prefect.flow-run.Running")
    assert trigger.covers(_event("prefect.flow-run.heartbeat", None))
    assert trigger.covers(_event("prefect.flow-run.heartbeat", None, tags=("gpt2", "pipeline", "preemptible")))
    assert not trigger.covers(_event("prefect.flow-run.heartbeat", None, tags=("gpt2",)))
    assert trigger.expects("prefect.flow-run.Completed") and trigger.expects("prefect.flow-run.AwaitingRetry")
    # Three missed beats at the heartbeat period the GPU pools set.
    assert trigger.within.total_seconds() == 3 * deployment_file.GPU_HEARTBEAT_S


def _wait_state(client, run_id, until, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.read_flow_run(run_id)
        if until(run.state):
            return run
        time.sleep(0.5)
    return client.read_flow_run(run_id)


def _run_then_crash(client, run_id) -> None:
    client.set_flow_run_state(run_id, Pending())
    client.set_flow_run_state(run_id, Running())
    client.set_flow_run_state(run_id, Crashed(message="process exited with -9"))


# The reschedule automation's wait on the real server: Prefect's floor for a proactive trigger here
# (the product waits 20 s, past a process worker's second crash report; no worker reports here),
# still long enough that a reschedule at the first Crashed event would show.
SHORT_RESCHEDULE_S = deployment_file.MIN_PROACTIVE_S


def test_real_server_reschedules_a_crashed_preemptible_run(prefect_server):
    from prefect import flow

    @flow(name="gpt2-automation-probe")
    def probe() -> None: ...

    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(RESCHEDULE):
            client.delete_automation(old.id)
        spec = _specs_waiting(SHORT_RESCHEDULE_S)[RESCHEDULE]
        automation_id = client.create_automation(AutomationCore.model_validate(spec))
        try:
            # Prefect only reschedules runs of a deployment (a worker must be able to pick it up).
            deployment_id = client.create_deployment(client.create_flow(probe), "probe")
            untagged = client.create_flow_run_from_deployment(deployment_id, tags=["gpt2"])
            run = client.create_flow_run_from_deployment(deployment_id, tags=["gpt2", "gpu", "preemptible"])
            time.sleep(2)  # let the automation load before the first event
            _run_then_crash(client, untagged.id)
            _run_then_crash(client, run.id)
            crashed_at = time.monotonic()
            after = _wait_state(client, run.id, lambda s: s.type == StateType.SCHEDULED, 60)
            assert (after.state.name, after.run_count) == ("AwaitingRetry", 1)
            assert time.monotonic() - crashed_at >= SHORT_RESCHEDULE_S - 1
            assert client.read_flow_run(untagged.id).state.type == StateType.CRASHED
        finally:
            client.delete_automation(automation_id)


def test_the_cap_covers_the_awaiting_retry_path_beyond_the_same_budget():
    """A SIGTERM on Kubernetes or Vertex puts the run straight back to
    AwaitingRetry, never Crashed: past the cap it is cancelled instead."""
    n = deployment_file.DEFAULT_MAX_RESCHEDULES
    trigger = _trigger(CAP)
    assert trigger.posture == "Reactive" and trigger.expects("prefect.flow-run.AwaitingRetry")
    covered = [trigger.covers(_event("prefect.flow-run.AwaitingRetry", k)) for k in range(1, n + 13)]
    assert covered == [False] * n + [True] * 12  # counts 1..N go back, N+1 and later (two digits too) do not
    assert not trigger.covers(_event("prefect.flow-run.AwaitingRetry", n + 1, tags=("gpt2",)))
    assert AutomationCore.model_validate(_specs()[CAP]).actions[0].type == "cancel-flow-run"
    for cap in (0, 9, 10, 41, 98):
        beyond = _trigger(CAP, cap)
        assert [beyond.covers(_event("prefect.flow-run.AwaitingRetry", k)) for k in range(1, 120)] == [
            k > cap for k in range(1, 120)]
    with pytest.raises(ValueError, match="max_reschedules"):
        deployment_file.automations(99)


def test_real_server_cancels_a_run_put_back_beyond_the_cap(prefect_server):
    from prefect import flow

    @flow(name="gpt2-cap-probe")
    def probe() -> None: ...

    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(CAP):
            client.delete_automation(old.id)
        automation_id = client.create_automation(AutomationCore.model_validate(_specs(1)[CAP]))
        try:
            deployment_id = client.create_deployment(client.create_flow(probe), "probe")
            run = client.create_flow_run_from_deployment(deployment_id, tags=["gpt2", "gpu", "preemptible"])
            time.sleep(2)  # let the automation load before the first event
            for _ in range(2):  # preempted twice: the second AwaitingRetry is past a cap of 1
                client.set_flow_run_state(run.id, Pending())
                client.set_flow_run_state(run.id, Running())
                client.set_flow_run_state(run.id, AwaitingRetry(), force=True)
                first = client.read_flow_run(run.id)
                if first.run_count == 1:
                    time.sleep(3)  # within the cap: left alone
                    assert client.read_flow_run(run.id).state.name == "AwaitingRetry"
            after = _wait_state(client, run.id, lambda s: s.type == StateType.CANCELLED, 60)
            assert (after.state.type, after.run_count) == (StateType.CANCELLED, 2)
        finally:
            client.delete_automation(automation_id)


def test_applying_the_automations_twice_leaves_one_of_each(prefect_server):
    """`gpt2 stack automations` against the active profile's server (here the
    test server): idempotent, with the cap it is given."""
    import json

    from typer.testing import CliRunner

    from cli.main import app

    for _ in range(2):
        result = CliRunner().invoke(app, ["stack", "automations", "--max-reschedules", "5", "--json"])
        assert result.exit_code == 0, result.output
    names = json.loads(result.stdout)["automations"]
    assert set(names) == set(_specs())
    with get_client(sync_client=True) as client:
        for name in names:
            [applied] = client.read_automations_by_name(name)
            if name == RESCHEDULE:
                assert applied.trigger.match["prefect.run-count"] == deployment_file.run_counts(5)
            client.delete_automation(applied.id)


@pytest.mark.e2e
def test_real_server_crashes_a_run_that_died_before_its_first_heartbeat(prefect_server):
    """Its machine and worker gone between Running and the first beat (found by
    the fault soak: the pipeline's parent sat Running for ever)."""
    from prefect import flow

    @flow(name="gpt2-zombie-probe")
    def probe() -> None: ...

    # Our automation as the product writes it, its window shortened here (the product's floor, 60 s,
    # is two missed heartbeats, and no heartbeat is sent here): the server's proactive trigger on the
    # same spec, after Running and before any beat, is what is checked.
    window = deployment_file.MIN_PROACTIVE_S  # Prefect's floor for a proactive trigger
    spec = {s["name"]: s for s in deployment_file.automations(zombie_after_s=deployment_file.MIN_ZOMBIE_AFTER_S)}[ZOMBIE]
    spec["trigger"]["within"] = window
    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(ZOMBIE):
            client.delete_automation(old.id)
        automation_id = client.create_automation(AutomationCore.model_validate(spec))
        try:
            deployment_id = client.create_deployment(client.create_flow(probe), "zombie-probe")
            run = client.create_flow_run_from_deployment(deployment_id, tags=["gpt2", "pipeline"])
            time.sleep(2)  # let the automation load before the first event
            client.set_flow_run_state(run.id, Pending())
            client.set_flow_run_state(run.id, Running())  # ... and not a beat after it
            running_at = time.monotonic()
            after = _wait_state(client, run.id, lambda s: s.type == StateType.CRASHED, window + 60)
            assert "No heartbeat" in after.state.message
            assert time.monotonic() - running_at >= window - 1  # the window, not the first event
        finally:
            client.delete_automation(automation_id)
