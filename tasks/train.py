"""Prefect task of the training stage: calls `gpt2.launch.torchrun.train_stage`.

Cached on the training identity (gpt2.config.identity.train_fingerprint) + code
version. Retrying is always safe because training resumes from the newest
checkpoint; errors that a retry cannot fix (NaN loss, loss spikes past
train.max_rollbacks, out of memory, a bad batch shape, a failed preflight: tasks.preflight) and preemption (the process is going away) are not retried.
A multi-node run whose other machines were preempted ends Crashed, like a
preempted machine's own run, for the reschedule automation.
"""

from __future__ import annotations

import os
import secrets
import signal

from prefect import get_run_logger, task
from prefect.exceptions import TerminationSignal

from gpt2.config.identity import train_fingerprint
from gpt2.config.tree import Config
from gpt2.data.epoch import with_resolved_steps
from gpt2.ladder.rungs import LeftRung
from gpt2.launch.torchrun import train_stage
from gpt2.preflight.child import PreflightFailed
from gpt2.process.distributed import pick_device
from gpt2.root import layout
from gpt2.train.compile_cache import SECRET_ENV
from gpt2.train.compile_choice import resolve_compile
from gpt2.train.progress import ProgressBar, StepInfo
from gpt2.train.run import Preempted
from gpt2.train.session import TrainingError
from gpt2.weights.init import with_resolved_init
from tasks.common import ProgressArtifact, identity_cache_key
from tasks.preflight import preflight_first

COMPILE_SECRET_BLOCK = "gpt2-compile-cache"
"""The Prefect Secret block holding the key that signs compiled programs (gpt2.train.compile_cache)."""


def share_compile_secret(config: Config) -> None:
    """Every machine of a deployment signs and checks the run's compiled
    program with one secret, kept by the Prefect API, never in the root: made
    at the first compiled run, read by every later attempt on any machine."""
    if os.environ.get(SECRET_ENV) or not resolve_compile(config.runtime.compile, pick_device(config.runtime.device)):
        return
    from prefect.blocks.system import Secret

    try:
        value = Secret.load(COMPILE_SECRET_BLOCK).get()
    except ValueError:  # none yet: this is the first
        try:
            Secret(value=secrets.token_hex(32)).save(COMPILE_SECRET_BLOCK)
        except ValueError:  # another first run saved one just now: theirs
            pass
        value = Secret.load(COMPILE_SECRET_BLOCK).get()
    os.environ[SECRET_ENV] = value  # the trainer and the preflight, our children, inherit it


def _retryable(task, task_run, state) -> bool:
    return not isinstance(state.result(raise_on_failure=False), (TrainingError, PreflightFailed, FileNotFoundError, LeftRung))


@task(name="train", cache_key_fn=identity_cache_key("train", train_fingerprint), persist_result=True,
      retries=2, retry_delay_seconds=30, retry_condition_fn=_retryable)
def train(config: Config, parent_run_id: str | None = None, tags: dict | None = None) -> dict:
    config = with_resolved_init(with_resolved_steps(config))  # the flow passes it resolved; direct callers may not
    artifact = ProgressArtifact(f"Training {layout.run_name(config)}")
    bar = ProgressBar(config.train.max_steps)

    def progress(info: StepInfo) -> None:
        bar(info)
        artifact.update(info.fraction)

    share_compile_secret(config)
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
