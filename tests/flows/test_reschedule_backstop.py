"""The parent's backstop for the reschedule automation (flows.stages.
reschedule_in_its_place), on a real Prefect server with the project's own
automations: a stage run still Crashed after the grace is put back exactly as
the automation would have, and only where the automation would have.

The fault soak (bench/soak/run.py) found why it is needed: after a Prefect server
restart the automation missed a training run the zombie automation had marked
Crashed (its Crashed event followed a Running event from before the restart,
and the restarted server holds such an event for 15 minutes), so the pipeline
failed a stage that a reschedule would have resumed."""

from __future__ import annotations

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Crashed, Pending, Running, Scheduled

from cli.stack.prefect_setup import replace_automations
from flows.stages import reschedule_in_its_place


@flow
def _backstop(run_id: str) -> bool:
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    return reschedule_in_its_place(run, grace_s=120)


@flow
def _stage() -> None:
    pass


def _crashed_run(client, tags: list[str], runs: int = 1):
    """A deployment's flow run (a stage's) that ran `runs` time(s) and crashed."""
    deployment = client.create_deployment(flow_id=client.create_flow(_stage), name="backstop")
    run = client.create_flow_run_from_deployment(deployment, tags=tags)
    for _ in range(runs):
        client.set_flow_run_state(run.id, Running(), force=True)
        client.set_flow_run_state(run.id, Crashed(message="No heartbeat for 90 s"), force=True)
    return client.read_flow_run(run.id)


def _crashed_unstarted(client, tags: list[str], crashes: int = 1):
    """A stage's flow run whose process exited before its flow ran (run count 0),
    `crashes` times: as the soak saw it, started while the Prefect server was away."""
    deployment = client.create_deployment(flow_id=client.create_flow(_stage), name="backstop")
    run = client.create_flow_run_from_deployment(deployment, tags=tags)
    for i in range(crashes):
        if i:
            client.set_flow_run_state(run.id, Scheduled(name="AwaitingRetry"), force=True)
        client.set_flow_run_state(run.id, Pending(), force=True)
        client.set_flow_run_state(run.id, Crashed(
            message="Flow run infrastructure exited with non-zero status code 1."), force=True)
    return client.read_flow_run(run.id)


@pytest.fixture
def automations(prefect_server):
    with get_client(sync_client=True) as client:
        replace_automations(client, max_reschedules=2, zombie_after_s=90)
        yield client
        for name in ("gpt2-reschedule-preempted", "gpt2-reschedule-cap", "gpt2-zombie-runs"):
            for automation in client.read_automations_by_name(name):
                client.delete_automation(automation.id)


def test_a_preemptible_run_left_crashed_is_put_back_as_the_automation_would(automations):
    run = _crashed_run(automations, ["gpu", "preemptible"])
    assert run.run_count == 1 and run.state.is_crashed()
    assert _backstop(str(run.id)) is True
    state = automations.read_flow_run(run.id).state
    assert state.is_scheduled() and state.name == "AwaitingRetry"
    assert "gpt2-reschedule-preempted did not act" in state.message


def test_only_where_the_automation_would_have(automations):
    untagged = _crashed_run(automations, ["gpu"])  # not preemptible: a crash is final
    spent = _crashed_run(automations, ["gpu", "preemptible"], runs=3)  # beyond max_reschedules=2
    assert [_backstop(str(r.id)) for r in (untagged, spent)] == [False, False]
    assert all(automations.read_flow_run(r.id).state.is_crashed() for r in (untagged, spent))


def test_a_stage_that_crashed_before_it_ever_ran_is_started_again_within_the_budget(automations):
    """The soak's defect: the evaluate stage's process started while the Prefect
    server was away, exited before its flow ran (run count 0), which the
    automation never reschedules, and the pipeline failed. A start that can
    never work (a bad image) still ends Crashed once the budget is spent."""
    run = _crashed_unstarted(automations, ["gpu", "preemptible"])
    assert run.run_count == 0 and run.state.is_crashed()
    assert _backstop(str(run.id)) is True
    state = automations.read_flow_run(run.id).state
    assert state.is_scheduled() and state.name == "AwaitingRetry" and "before it ever ran" in state.message
    spent = _crashed_unstarted(automations, ["gpu", "preemptible"], crashes=3)  # beyond max_reschedules=2
    untagged = _crashed_unstarted(automations, ["gpu"])
    assert [_backstop(str(r.id)) for r in (spent, untagged)] == [False, False]
    assert all(automations.read_flow_run(r.id).state.is_crashed() for r in (spent, untagged))


def test_no_automation_on_the_server_means_no_backstop(prefect_server):
    with get_client(sync_client=True) as client:
        for automation in client.read_automations_by_name("gpt2-reschedule-preempted"):
            client.delete_automation(automation.id)
        run = _crashed_run(client, ["gpu", "preemptible"])
        assert _backstop(str(run.id)) is False
        assert client.read_flow_run(run.id).state.is_crashed()


# The stack's rescheduler (flows.reschedule.sweep): the same rule for every
# Crashed preemptible run, the pipeline's parent included. The soak found why:
# a pipeline's parent SIGKILLed while the Prefect server was busy (a full disk,
# a frozen server moments later) stayed Crashed for good: its Crashed event
# never reached the automation, and nothing above a parent puts it back.

def _later(seconds: float):
    from datetime import datetime, timedelta, timezone

    return datetime.now(timezone.utc) + timedelta(seconds=seconds)


def test_the_sweep_puts_back_a_crashed_parent_the_automation_missed(automations):
    from flows import reschedule

    (automation,) = automations.read_automations_by_name("gpt2-reschedule-preempted")
    # The automation misses the crash (paused while the run crashes), then is on again.
    automations.pause_automation(automation.id)
    parent = _crashed_run(automations, ["gpt2", "pipeline", "preemptible"])
    automations.resume_automation(automation.id)
    said = []
    assert parent.name not in reschedule.sweep(automations, grace_s=120, say=said.append)  # the automation's time
    assert automations.read_flow_run(parent.id).state.is_crashed()

    # (The server is shared: runs other tests left Crashed may be put back too.)
    assert parent.name in reschedule.sweep(automations, grace_s=120, now=_later(121), say=said.append)
    state = automations.read_flow_run(parent.id).state
    assert state.is_scheduled() and state.name == "AwaitingRetry"
    assert "the stack's rescheduler" in state.message and "did not act" in state.message
    assert any(parent.name in line and "rescheduled it" in line for line in said), said


def test_the_sweep_leaves_what_the_automation_would_leave(automations):
    from flows import reschedule

    untagged = _crashed_run(automations, ["gpt2", "pipeline"])
    spent = _crashed_run(automations, ["gpu", "preemptible"], runs=3)  # beyond max_reschedules=2
    done = reschedule.sweep(automations, grace_s=120, now=_later(121), say=lambda _: None)
    assert untagged.name not in done and spent.name not in done
    assert all(automations.read_flow_run(r.id).state.is_crashed() for r in (untagged, spent))


def test_the_sweep_starts_a_run_that_crashed_before_it_ever_ran_again_after_a_short_wait(automations):
    from flows import reschedule

    unstarted = _crashed_unstarted(automations, ["gpt2", "pipeline", "preemptible"])
    spent = _crashed_unstarted(automations, ["gpt2", "pipeline", "preemptible"], crashes=3)
    said = []
    assert unstarted.name not in reschedule.sweep(automations, grace_s=120, say=said.append)  # the worker's late report
    done = reschedule.sweep(automations, grace_s=120, now=_later(reschedule.UNSTARTED_GRACE_S + 1), say=said.append)
    assert unstarted.name in done and spent.name not in done
    assert "before it ever ran" in automations.read_flow_run(unstarted.id).state.message
    assert automations.read_flow_run(spent.id).state.is_crashed()


def test_no_automation_means_the_sweep_does_nothing(prefect_server):
    from flows import reschedule

    with get_client(sync_client=True) as client:
        for automation in client.read_automations_by_name("gpt2-reschedule-preempted"):
            client.delete_automation(automation.id)
        run = _crashed_run(client, ["gpu", "preemptible"])
        assert reschedule.sweep(client, grace_s=120, now=_later(121), say=lambda _: None) == []
        assert client.read_flow_run(run.id).state.is_crashed()
