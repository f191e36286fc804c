"""The kill window: how long a SIGTERMed trainer has to save its checkpoint
before SIGKILL, and whether a save fits it.

Both sides read it: the launchers (gpt2.launch), which give the trainer this
long and warn before a run whose save is not expected to fit, and the
checkpoint writer (gpt2.checkpoint.writer), which times every save against
it. It sits below both so neither imports the other.
"""

from __future__ import annotations

import os

STOP_GRACE_S = 120.0
"""How long a trainer told to stop by our own launcher (gpt2.launch.torchrun)
may take to write its checkpoint before it is killed."""

TORCHRUN_STOP_S = 30.0
"""What torchrun (torch.distributed.elastic) gives its workers between the
SIGTERM it forwards and its SIGKILL."""

POOL_ENV = "GPT2_POOL"
"""Set by the GPU pools' job templates (deployments/pools/) to the pool kind
below, so `runtime.pool=auto` knows where it runs."""
POOLS = ("process", "kubernetes", "gke-spot", "gke-autopilot-spot", "vertex")
EXECUTE_STOP_S = 30.0
"""`prefect flow-run execute` (what a container pool runs) with the SIGTERM
behaviour `reschedule`: it stops the engine with this grace, then exits, and the
container (and the trainer in it) goes with it."""
GKE_SPOT_S = 15.0
"""GKE Standard gives the pods of a Spot VM node this long by default (up to
120 s only through the node pool's system config, kubelet
shutdownGracePeriodSeconds, on recent GKE versions)."""
GKE_AUTOPILOT_SPOT_S = 25.0
"""GKE Autopilot gives Spot Pods this long."""
COMPUTE_PREEMPTION_S = 30.0
"""Compute Engine's notice before it stops a Spot/preemptible VM (Vertex AI's spot jobs run on them)."""


def resolve_pool(pool: str = "auto") -> str:
    """`runtime.pool`: `auto` is what the pool's template says ($GPT2_POOL), else a process pool."""
    resolved = (os.environ.get(POOL_ENV, "").strip() or "process") if pool == "auto" else pool
    if resolved not in POOLS:
        raise ValueError(f"unknown pool kind {resolved!r} (from ${POOL_ENV} or runtime.pool); known: "
                         f"{', '.join(POOLS)}")
    return resolved


def pool_limit(pool: str, grace_s: float | None = None) -> tuple[float, str] | None:
    """(seconds, why) the pool itself leaves a SIGTERMed flow run, or None where
    only our own launchers bound it (a process pool). `grace_s`: the pod's
    termination grace period where it is known (Kubernetes pools; the gpu
    pool's template keeps it at 30 s or more, so 30 s is its limit)."""
    execute = (EXECUTE_STOP_S,
               "prefect flow-run execute's grace for the engine after a SIGTERM (then the container exits)")
    if pool == "process":
        return None
    if pool == "vertex":
        return min((COMPUTE_PREEMPTION_S, "Compute Engine's notice before it stops a Spot VM"), execute,
                   key=lambda limit: limit[0])
    limits = [execute]
    if grace_s is not None:
        limits.append((grace_s, "the pod's terminationGracePeriodSeconds (termination_grace_period_seconds)"))
    if pool == "gke-spot":
        limits.append((GKE_SPOT_S, ("GKE's shutdown window for the pods of a Spot VM node (15 s by default; up "
                                    "to 120 s through the node pool's kubelet shutdownGracePeriodSeconds)")))
    if pool == "gke-autopilot-spot":
        limits.append((GKE_AUTOPILOT_SPOT_S, "GKE Autopilot's notice to a Spot Pod"))
    return min(limits, key=lambda limit: limit[0])


def kill_window(distributed: bool, pool: str = "auto", grace_s: float | None = None) -> tuple[float, str]:
    """(seconds, what sets them) a stopped trainer has to save its checkpoint:
    under torchrun its 30 s; alone, our launcher's grace (STOP_GRACE_S);
    and no longer than the pool allows (pool_limit: Kubernetes min(30 s, the
    pod's grace), GKE Spot 15 s, Autopilot Spot 25 s, Vertex 30 s)."""
    if distributed and TORCHRUN_STOP_S < STOP_GRACE_S:
        ours = (TORCHRUN_STOP_S, "torchrun's wait between its SIGTERM and SIGKILL")
    else:
        ours = (STOP_GRACE_S, "the launcher's wait between SIGTERM and SIGKILL (gpt2.process.kill_window.STOP_GRACE_S)")
    limit = pool_limit(resolve_pool(pool), grace_s)
    return min(ours, limit, key=lambda window: window[0]) if limit is not None else ours


def lengthen(what: str) -> str:
    """How to get a longer window from what sets it."""
    if "Spot VM node" in what:
        return ("raise the node pool's kubelet shutdownGracePeriodSeconds (GKE node system config, up to 120 s) "
                "or train on a pool that is not Spot")
    if "Autopilot" in what or "Compute Engine" in what:
        return "train on capacity that is not Spot (the notice is fixed)"
    if "flow-run execute" in what:
        return "nothing in the pool lengthens prefect flow-run execute's 30 s"
    if "terminationGracePeriodSeconds" in what:
        return "raise the gpu pool's termination_grace_period_seconds"
    return "give the pod longer (termination_grace_period_seconds of the gpu pool) where that is the limit"


def window_warning(step: int, seconds: float, local_s: float, window: tuple[float, str]) -> str | None:
    """A warning when a checkpoint save outlasts the kill window, naming what
    to change; None when it fits. Every save is timed, so a save that would
    not survive a preemption is reported long before one happens."""
    limit, what = window
    if seconds <= limit:
        return None
    head = (f"the checkpoint of step {step} took {seconds:.1f} s (local write {local_s:.1f} s), more than the "
            f"{limit:.0f} s a preempted trainer gets ({what})")
    if local_s > limit:
        return (head + ": after a SIGTERM not even its local copy would be complete; put runtime.work_dir on a "
                f"faster local disk (a local SSD), lower train.checkpoint_every to lose fewer steps, or "
                f"{lengthen(what)}")
    return (head + ": after a SIGTERM only its local copy would be sure to be complete (uploaded when the run "
            "restarts on this machine; a new machine or pod resumes from the previous checkpoint); lower "
            f"train.checkpoint_every to lose fewer steps, use a root closer to the GPUs, or {lengthen(what)}")


ASSUMED_LOCAL_WRITE_BPS = 200e6
"""Bytes/s a checkpoint's local copy is assumed to be written at before a run
has timed one (a cloud VM's persistent boot disk: a few hundred MB/s at best)."""
ASSUMED_UPLOAD_BPS = 100e6
"""Bytes/s its upload to a remote root is assumed to take (one gcsfs/s3fs stream)."""


def expected_save_s(checkpoint_bytes: int, remote_root: bool) -> float:
    """A SIGTERM checkpoint's expected duration before any save was timed: the
    local copy, then (remote root) the upload a new pod or machine resumes from."""
    return checkpoint_bytes / ASSUMED_LOCAL_WRITE_BPS + (checkpoint_bytes / ASSUMED_UPLOAD_BPS if remote_root else 0)


def expected_window_warning(checkpoint_bytes: int, remote_root: bool, window: tuple[float, str],
                            checkpoint_every: int) -> str | None:
    """Before the run (the trainer's launcher, `gpt2 plan`): a warning when the
    checkpoint a SIGTERM asks for is expected to outlast the kill window, so a
    preemption resumes from the last periodic checkpoint instead; None when it fits."""
    limit, what = window
    seconds = expected_save_s(checkpoint_bytes, remote_root)
    if seconds <= limit:
        return None
    rates = f"~{ASSUMED_LOCAL_WRITE_BPS / 1e6:.0f} MB/s local write" + (
        f" then ~{ASSUMED_UPLOAD_BPS / 1e6:.0f} MB/s upload" if remote_root else "")
    return (f"a checkpoint ({checkpoint_bytes / 1e9:.1f} GB) is expected to take ~{seconds:.0f} s to save "
            f"({rates}, assumed), more than the {limit:.0f} s a preempted trainer gets ({what}): a preemption "
            f"then resumes from the last periodic checkpoint, up to train.checkpoint_every={checkpoint_every} "
            f"steps back; lower train.checkpoint_every to lose fewer steps, or {lengthen(what)}")
