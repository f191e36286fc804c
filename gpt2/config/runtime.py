"""The `runtime` section of the config tree (gpt2.config.tree): where and how
fast things run (device, workers, pools, the artifact root). It never enters an
identity, so changing the hardware never invalidates a result."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from gpt2.config.sections import Section

ROOT_ENV = "GPT2_ROOT"


class GpuPool(Section):
    """One rung of the ladder of GPU pools (runtime.gpu_pools): a Prefect work pool
    that has the train and evaluate deployments (prefect.yaml), its price, and how
    long a run may wait or be preempted there before the run moves down a rung."""

    pool: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    """The work pool's name (its deployments are `train-<pool>` and
    `evaluate-<pool>`; pool `gpu`'s are `train` and `evaluate`)."""
    price_per_hour: float | None = Field(None, ge=0)
    """Price of one device (GPU) on this pool for an hour; None: runtime.price_per_hour."""
    start_timeout_s: float = Field(600.0, gt=0)
    """How long a run may wait here to start (no worker, no machine) before the run
    moves down a rung; on the last rung runtime.stage_start_timeout_s applies."""
    max_preemptions: int = Field(3, ge=1)
    """Preemptions on this pool after which the run moves down a rung (on the last
    rung the reschedule automation's own cap applies)."""

    @classmethod
    def parse(cls, text: str) -> dict:
        """`pool[:price[:start_timeout_s[:max_preemptions]]]`, the `--set` shorthand."""
        parts = text.strip().split(":")
        keys = ("pool", "price_per_hour", "start_timeout_s", "max_preemptions")
        if len(parts) > len(keys):
            raise ValueError(f"rung {text!r} has more than pool:price:start_timeout_s:max_preemptions")
        return {k: v for k, v in zip(keys, parts) if v != ""}


class RuntimeConfig(Section):
    root: str = Field(default_factory=lambda: os.environ.get(ROOT_ENV) or "file://./artifacts")
    """Artifact root (fsspec URL) where every output lives; default $GPT2_ROOT,
    else ./artifacts (`gpt2 stack up` sets $GPT2_ROOT for its workers)."""
    work_dir: str | None = None
    """Local scratch directory for intermediate files; None: ~/.cache/gpt2-pipeline."""
    num_workers: int = Field(0, ge=0)
    """Tokenizer processes; 0 uses every core."""
    tokenize_part_tokens: int = Field(1 << 25, ge=1)
    """Most tokens in one work unit of the tokenize step (estimated from the source's
    bytes; small corpora get smaller units so every worker has many): the most work
    a kill can lose per worker."""
    device: str = "auto"
    """`auto`, `cpu`, `cuda`, `cuda:N` or `mps`."""
    compile: bool | Literal["auto"] = "auto"
    """Compile the model with torch.compile (static shapes): true, false, or `auto`,
    which compiles on CUDA cards Triton compiles for (compute capability 7.0 and up)
    and runs eagerly elsewhere (CPU, MPS, a P100): where compiling fails, `auto` trains
    eagerly with one warning (and the run's later attempts start eagerly), `true`
    stops with the error."""
    nproc_per_node: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """Processes (GPUs) to train with; >1 runs torchrun. `auto`: one per GPU visible
    on the machine that trains (1 without a GPU or with a CPU/MPS `runtime.device`),
    so the pool's GPU count alone decides."""
    nnodes: int = Field(1, ge=1)
    """Machines to train across (torchrun --nnodes); each runs nproc_per_node
    processes. >1 needs rdzv_endpoint (set by the training flow on Kubernetes)."""
    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous every node joins when nnodes > 1 (on
    Kubernetes the training flow sets it: pod 0 of its Job through the headless
    Service; see docs/multi-node.md)."""
    rdzv_timeout_s: float = Field(1800.0, gt=0)
    """How long each node waits for the others at the rendezvous (torchrun's
    join_timeout, and read_timeout: how long a node waits for the node that serves
    it). Nodes of a cold cluster (autoscaled Spot GPU nodes pulling a multi-GB
    image) start minutes apart, so the default is 30 minutes."""
    node_gpu_type: str | None = None
    """GPU of a multi-node run's training pods on Kubernetes (the GKE accelerator
    label cloud.google.com/gke-accelerator of their node selector, e.g.
    nvidia-h100-80gb); None: the flow pod's. The flow pod only coordinates: give
    it gpu_count=0 and set runtime.nproc_per_node to the nodes' GPUs."""
    pool: Literal["auto", "process", "kubernetes", "gke-spot", "gke-autopilot-spot", "vertex"] = "auto"
    """Where training runs, for the time a SIGTERM (preemption) leaves the trainer to
    write its checkpoint (gpt2.process.kill_window.kill_window): `kubernetes` min(30 s,
    the pod's grace), `gke-spot` 15 s, `gke-autopilot-spot` 25 s, `vertex` 30 s,
    `process` only our launchers' limits. `auto`: what the GPU pool's job template
    sets ($GPT2_POOL), else `process`. `gpt2 plan` warns when a save will not fit."""
    shard_optimizer: bool | Literal["auto"] = "auto"
    """ZeRO-1: shard AdamW's state across ranks (torch's ZeroRedundancyOptimizer);
    same updates, 1/world of the optimizer memory. Checkpoints hold the full AdamW
    state either way. `auto` turns it on only when the micro-batch search
    (train.micro_batch_size=auto) needs it to fit, before halving the micro-batch;
    beside a fixed micro-batch `auto` is off. No effect on one process."""
    recompute: bool | Literal["auto"] = "auto"
    """Activation recomputation per transformer block (torch.utils.checkpoint): same
    results, far less activation memory, about a third more compute. `auto` turns it
    on only when the micro-batch search (train.micro_batch_size=auto) needs it, and
    only rather than halve the micro-batch below 8 sequences: above that, halving
    costs less than the recomputation. Beside a fixed micro-batch `auto` is off."""
    data_cluster: str | None = None
    """Tokenize the source's work units on a Dask cluster (through prefect-dask):
    `local` starts one on this machine with num_workers worker processes; a
    `tcp://host:8786` address uses a running cluster. None: this machine's own
    process pool."""
    lease_ttl_s: float = Field(120.0, ge=1)
    """A training run's lease (one trainer per run) goes stale this long after
    its trainer last renewed it (every lease_ttl_s / 4); then another may take over."""
    stage_start_timeout_s: float = Field(3600.0, gt=0)
    """A stage deployment run that waits this long to start (no worker on its
    pool, no GPU capacity) fails the pipeline with a message saying so."""
    max_parallel_runs: int = Field(1, ge=1)
    """Most members of a sweep (`gpt2 sweep`) training at once; the others wait their turn.
    The GPU pool's own concurrency limit applies too, whichever is lower. 1 by default: a
    second member in flight rents a second GPU machine, which only pays when the pool has the
    slots and the budget allows it (prefect.yaml gives the train deployment one slot)."""
    lease_wait_s: float = Field(0.0, ge=0)
    """How long a trainer waits for a run held by another before refusing (0: refuse at once)."""
    collective_timeout_s: float = Field(600.0, gt=0)
    """How long a rank waits in a training collective (NCCL's timeout; 30 minutes by
    torch's default) before its run fails. It bounds a hang when a peer dies without
    closing its connections (a lost node); a failure a peer survives (an error, an
    OOM) stops every rank at the next step instead. It must outlast the longest
    wait of one rank for another in a step: compilation skew, a checkpoint save
    waiting for the previous upload. The waits before training (rank 0 reading the
    checkpoint, the lease) have their own hour (plus runtime.lease_wait_s)."""
    price_per_hour: float | None = Field(None, ge=0)
    """Price of one training device (GPU) for an hour, in your currency: the training
    bill's `cost` is this × its device-hours (gpt2.train.bill). None: no cost is given."""
    cpu_price_per_hour: float | None = Field(None, ge=0)
    """Price of the CPU machine of the data and export stages for an hour: the
    pipeline's bill counts those stages at this price. None: they are not priced."""
    heartbeat_s: float = Field(30.0, ge=0)
    """How often a training attempt's record in the run directory is brought up to date
    (its steps and time; gpt2.train.attempts). An attempt killed without notice is billed
    up to its last update, so this is what such a kill can leave out of the bill."""
    gpu_pools: tuple[GpuPool, ...] = ()
    """The ladder of GPU pools, cheapest first: the train and evaluate stages of a
    pipeline run from a deployment start on the first rung and move down when a rung
    does not start them within its start_timeout_s, crashes them before they run, or
    preempts them max_preemptions times. A list of {pool, price_per_hour,
    start_timeout_s, max_preemptions}, or on the command line
    `gpu-spot:1.2:600:3,gpu:3.9`. Empty: the one `gpu` pool of prefect.yaml."""

    @field_validator("gpu_pools", mode="before")
    @classmethod
    def _rungs(cls, value):
        if isinstance(value, str):
            return [GpuPool.parse(part) for part in value.split(",") if part.strip()]
        return value

    @field_validator("gpu_pools")
    @classmethod
    def _distinct_rungs(cls, rungs):
        names = [r.pool for r in rungs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"names pool {', '.join(twice)} more than once; each rung is one pool")
        return rungs

    keep_intermediate: Literal["inputs", "all", "none"] = "inputs"
    """Local copies the data stage keeps once its output is safe: `inputs` keeps the
    downloaded source and the token parts (new limits or a new data.shard_size redo
    only what they change) and removes the local shards once they are in the root;
    `all` keeps everything; `none` removes each copy once the next step has its output
    (least disk; new limits re-download, a new shard size re-tokenizes). The data stage
    checks the local disk it needs for the chosen mode before it starts."""

    @property
    def work_root(self) -> Path:
        """Local scratch root: work_dir, or ~/.cache/gpt2-pipeline."""
        return Path(self.work_dir or Path.home() / ".cache" / "gpt2-pipeline").expanduser()
    memory_limit_mb: int | None = Field(None, ge=1)
    """Treat the device as having only this much memory (rehearse a smaller GPU): on
    CUDA a per-process allocator cap; on CPU an enforced count of parameters,
    gradients, optimizer state and saved activations. Exceeding it raises
    torch.OutOfMemoryError. None: the device's real memory."""
