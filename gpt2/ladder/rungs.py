"""The rungs of the ladder of GPU pools (runtime.gpu_pools): which deployment
a GPU stage runs on at each rung, what a device-hour costs there, and the stop
of a run whose rung the ladder left (gpt2.ladder.moves decides when it leaves).

Prefect cannot move a flow run to another pool (a run's pool is its
deployment's), so moving down a rung is cancelling the run on the rung it
leaves and starting the next rung's deployment (flows/ladder.py does both).
"""

from __future__ import annotations

from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.root import layout, storage

FLOWS = {"train": "gpt2-train", "evaluate": "gpt2-eval"}
"""The GPU stages and their flows' names (prefect.yaml's entrypoints)."""
DEFAULT_POOL = "gpu"
"""The pool of prefect.yaml's own `train` and `evaluate` deployments."""
IN_PROCESS = ("runtime.gpu_pools is a ladder of work pools, but this pipeline runs its stages in this process, on "
              "no pool: run it from its deployment (`prefect deployment run gpt2/full-pipeline`; locally on `gpt2 "
              "stack up --gpu-pools POOL,...`), or drop runtime.gpu_pools")
"""The refusal of a ladder given to `gpt2 run` (and to the parent flow run outside a deployment)."""


def deployment(stage: str, pool: str) -> str:
    """The stage's deployment on `pool` (prefect.yaml names one per rung):
    `gpt2-train/train` on the `gpu` pool, `gpt2-train/train-gpu-spot` on `gpu-spot`."""
    name = stage if pool == DEFAULT_POOL else f"{stage}-{pool}"
    return f"{FLOWS[stage]}/{name}"


def price_for(config: Config, pool: str | None) -> float | None:
    """One device-hour on `pool`: its rung's price, else runtime.price_per_hour."""
    for rung in config.runtime.gpu_pools:
        if rung.pool == pool and rung.price_per_hour is not None:
            return rung.price_per_hour
    return config.runtime.price_per_hour


class LeftRung(UserError):
    """This stage run's rung was left by the ladder: it must not train or evaluate."""


def stop_if_left(config: Config, lease, flow_run_id: str | None) -> None:
    """Right after the trainer took the run's lease (rank 0 holds `lease`): a run
    whose rung the ladder left while it was starting (the race: its worker took
    it just as the ladder moved on) lets the lease go and stops, having trained
    nothing. The ladder marks the run before it cancels it and before it starts
    the next rung's run, so the check cannot miss a run that was left."""
    if lease is None or not flow_run_id:
        return
    marker = layout.left_run_marker(layout.root(config), flow_run_id)
    if storage.exists(marker):
        lease.release()
        why = storage.read_bytes(marker).decode(errors="replace")
        raise LeftRung(f"flow run {flow_run_id} was moved off its work pool by the ladder of GPU pools ({why}); "
                       "it trains nothing: the run goes on on the next rung")
