"""A stage task retries what may pass next time, never bad input or damaged
data (tasks.common.not_user_error): a wrong data.source used to fail only
after two retries 10 s apart."""

from __future__ import annotations

import asyncio

from prefect import flow
from prefect.states import Failed

from gpt2.config.data import SourceError
from gpt2.config.overrides import resolve_config
from tasks.common import bind, not_user_error
from tasks.data import download


def test_bad_input_fails_on_its_first_run_without_retries(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client

    missing = tmp_path / "nope-*.jsonl"
    config = resolve_config("smoke", {"data.source": str(missing), "runtime.work_dir": str(tmp_path / "work")},
                            root=str(tmp_path / "root"))

    @flow
    def download_once():
        state = bind(download, config)(config, return_state=True)
        return state.is_failed(), state.message, state.state_details.task_run_id

    failed, message, task_run_id = download_once()
    assert failed and str(missing) in message

    async def run_count() -> int:
        async with get_client() as client:
            return (await client.read_task_run(task_run_id)).run_count

    assert asyncio.run(run_count()) == 1  # the task has retries=2: a retried run counts 3


def test_what_may_pass_next_time_is_retried():
    assert not_user_error(None, None, Failed(data=OSError("connection reset by peer"))) is True
    assert not_user_error(None, None, Failed(data=SourceError("no files match data.source"))) is False
