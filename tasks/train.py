"""Prefect task of the training stage: calls `gpt2.launch.torchrun.train_stage`.

Cached on the training identity (gpt2.identity.train_fingerprint) + code
version. Retrying is always safe because training resumes from the newest
checkpoint; errors that a retry cannot fix (NaN loss, out of memory, a bad
batch shape, a failed preflight: tasks.preflight) and preemption (the process is going away) are not retried.
A multi-node run whose other machines were preempted ends Crashed, like a
preempted machine's own run, for the reschedule automation.
"""

from __future__ import annotations

import signal

from prefect import get_run_logger, task
from prefect.exceptions import TerminationSignal

from gpt2 import layout
from gpt2.config import Config
from gpt2.identity import train_fingerprint
from gpt2.launch.torchrun import train_stage
from gpt2.preflight.child import PreflightFailed
from gpt2.steps import with_resolved_steps
from gpt2.train.progress import ProgressBar, StepInfo
from gpt2.train.run import Preempted
from gpt2.train.session import TrainingError
from tasks.common import ProgressArtifact, identity_cache_key
from tasks.preflight import preflight_first


def _retryable(task, task_run, state) -> bool:
    return not isinstance(state.result(raise_on_failure=False), (TrainingError, PreflightFailed, FileNotFoundError))


@task(name="train", cache_key_fn=identity_cache_key("train", train_fingerprint), persist_result=True,
      retries=2, retry_delay_seconds=30, retry_condition_fn=_retryable)
def train(config: Config, parent_run_id: str | None = None, tags: dict | None = None) -> dict:
    config = with_resolved_steps(config)  # the flow passes it resolved; direct callers may not
    artifact = ProgressArtifact(f"Training {layout.run_name(config)}")
    bar = ProgressBar(config.train.max_steps)

    def progress(info: StepInfo) -> None:
        bar(info)
        artifact.update(info.fraction)

    preflight_first(config, parent_run_id)  # train.preflight: this machine can finish the run, or fail now
    try:
        result = train_stage(config, progress, get_run_logger().info, parent_run_id, tags, isolate=True)
    except Preempted as err:
        if config.runtime.nnodes > 1:
            # Another machine of the run got the SIGTERM, not this process: end the run Crashed as Prefect's
            # SIGTERM bridge does on one machine, so the reschedule automation resumes it the same way.
            raise TerminationSignal(signal.SIGTERM) from err
        raise
    finally:
        bar.close()
    artifact.update(1.0, force=True)
    return result.to_dict()
