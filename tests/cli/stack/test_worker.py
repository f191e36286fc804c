"""The stack's worker guard is in place on the installed Prefect: a release without the parts it
wraps would leave a crash reported twice, and the second report landing on the next attempt
(what the guard prevents: tests/flows/test_pipeline_deployments.py, that report held back)."""

from __future__ import annotations


def test_the_guard_wraps_the_runners_execution_and_the_workers_report_once(monkeypatch):
    from prefect.runner._flow_run_executor import FlowRunExecutor
    from prefect.workers.base import BaseWorker

    from cli.stack import worker

    before = (FlowRunExecutor.submit, BaseWorker._propose_crashed_state)
    # Put back as they were once the test ends: the guard is for the stack's worker processes.
    monkeypatch.setattr(FlowRunExecutor, "submit", before[0])
    monkeypatch.setattr(BaseWorker, "_propose_crashed_state", before[1])
    assert worker.install()
    after = (FlowRunExecutor.submit, BaseWorker._propose_crashed_state)
    assert after[0] is not before[0] and after[1] is not before[1] and after[0]._gpt2_guard
    assert worker.install() and (FlowRunExecutor.submit, BaseWorker._propose_crashed_state) == after  # once
