"""Reading a multi-node training Job: whether it is over, and what its nodes
report (the records gpt2.launch.node writes under the root).

The outcome maps to the same results and exceptions as one machine's
launcher: all nodes done -> the TrainResult of the node that held global
rank 0 (it names the checkpoint); a node's error -> TrainingError; a node
stopped by SIGTERM -> Preempted (every node stops at the same step, with a
checkpoint). A node that left no record (its pod deleted, its machine gone)
-> NodeLost, which a retry resumes from the newest checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpt2.config.tree import Config
from gpt2.root import layout, storage
from gpt2.train.run import Preempted, TrainResult
from gpt2.train.session import TrainingError


class NodeLost(RuntimeError):
    """A node of the Job ended without recording an outcome."""


@dataclass(frozen=True)
class JobState:
    final: bool
    succeeded: bool
    reason: str
    """The Job's condition (`Complete`, `Failed: BackoffLimitExceeded: ...`), or what it is waiting for."""


def _condition(job, kind: str):
    return next((c for c in job.status.conditions or [] if c.type == kind and c.status == "True"), None)


def job_state(job) -> JobState:
    """A V1Job's state. Final only once no pod is still terminating: a node
    that got SIGTERM writes its checkpoint in its grace period, after
    Kubernetes already marked the Job as failing (FailureTarget)."""
    status = job.status
    terminating = status.terminating or 0
    for kind, succeeded in (("Complete", True), ("Failed", False)):
        cond = _condition(job, kind)
        if cond is not None:
            reason = ": ".join(x for x in (kind, cond.reason, cond.message) if x)
            return JobState(final=not terminating, succeeded=succeeded, reason=reason)
    waiting = _condition(job, "FailureTarget")
    if waiting is not None:
        return JobState(False, False, f"failing ({waiting.reason}), {terminating} pod(s) terminating")
    return JobState(False, False, f"{status.active or 0} pod(s) active, {status.succeeded or 0} succeeded, "
                                  f"{status.failed or 0} failed")


def read_outcomes(config: Config, job: str) -> list[dict | None]:
    """Each node's record (None where a node wrote none)."""
    return [storage.read_record(layout.node_outcome(config, job, i)) for i in range(config.runtime.nnodes)]


def clear_outcomes(config: Config, job: str) -> None:
    """Before a new attempt of the Job: no record of an earlier one may be read as its outcome."""
    for i in range(config.runtime.nnodes):
        storage.remove(layout.node_outcome(config, job, i))


def outcome(job: str, state: JobState, records: list[dict | None]) -> TrainResult:
    """The Job's result, or the exception that one machine's launcher would raise."""
    errors = [f"node {i}: {r['message']}" for i, r in enumerate(records) if r and r["event"] == "error"]
    if errors:
        raise TrainingError(f"training Job {job} failed ({state.reason}):\n" + "\n".join(errors))
    preempted = [r for r in records if r and r["event"] == "preempted"]
    if preempted:
        raise Preempted(f"training Job {job} stopped by SIGTERM: {preempted[0]['message']}")
    missing = [str(i) for i, r in enumerate(records) if r is None]
    if missing:
        raise NodeLost(f"node(s) {', '.join(missing)} of training Job {job} ended without an outcome "
                       f"({state.reason}): its pod was deleted or its machine lost; running the stage "
                       "again resumes from the newest checkpoint")
    done = [r["result"] for r in records if r["result"].get("checkpoint")]
    if not done:
        raise TrainingError(f"training Job {job} finished but no node names a checkpoint")
    return TrainResult(**done[0])
