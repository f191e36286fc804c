"""What a run cost, from its attempt records (gpt2.train.attempts), and the
pipeline's sum over its stages. Logged to MLflow under one prefix, `bill/`:

    attempts              training attempts: starts that trained a step (one that failed or was stopped
                          before its first step adds its device time and start-up, not an attempt;
                          a rerun of a finished run adds nothing)
    device_hours          each attempt's wall time (start to end, or to its last sign of life) x its devices
    steps_redone          steps trained after the checkpoint the next attempt resumed from (trained twice),
                          and the steps a rollback past a loss spike threw away (train.on_spike=rollback)
    device_hours_redone   those steps at their attempt's device time per step (wall time after start-up / steps)
    startup_s             seconds before each attempt's first step, summed (a whole attempt that never stepped)
    data_wait_s           seconds the steps waited for their batches (shard downloads), summed
    cost                  each attempt's device_hours x its pool's price (the attempt record's
                          price_per_hour: its rung of runtime.gpu_pools, else runtime.price_per_hour);
                          absent without a price
    pools/<pool>/…        per work pool the attempts ran on (the ladder of GPU pools): attempts,
                          device_hours, cost

Only the time an attempt ran is billed: the hours or days between a kill and
the next attempt are nobody's device time.
"""

from __future__ import annotations

from typing import Any

PREFIX = "bill/"
METRICS = ("attempts", "device_hours", "steps_redone", "device_hours_redone", "startup_s", "data_wait_s", "cost")
PIPELINE_METRICS = METRICS + ("cpu_hours", "gpu_cost", "cpu_cost")
"""The parent run's: also the CPU stages' machine-hours and each part's cost."""


def _wall_s(record: dict) -> float:
    end = record.get("ended_at") or record.get("heartbeat_at") or record["started_at"]
    return max(0.0, float(end) - float(record["started_at"]))


def _redone(record: dict, following: dict | None) -> int:
    """Steps of `record` that were trained again: past the step the next attempt
    resumed from; for the last attempt, past its own last checkpoint (an error
    or a kill: the next attempt will start there)."""
    step = record.get("step")
    if step is None:
        return 0
    if following is not None and following.get("resumed_from") is not None:
        return max(0, int(step) - int(following["resumed_from"]))
    if record.get("end") in ("error", "killed") and record.get("last_checkpoint") is not None:
        return max(0, int(step) - int(record["last_checkpoint"]))
    return 0


def trained(record: dict) -> bool:
    """Whether the attempt trained a step: its first step was recorded, or it
    reached a step past the one it started from."""
    if record.get("first_step_at") is not None:
        return True
    return int(record.get("step") or 0) > int(record.get("resumed_from") or 0)


def _startup_s(record: dict) -> float:
    known = record.get("startup_s")
    return float(known) if known is not None else _wall_s(record)


def _price(record: dict, price_per_hour: float | None) -> float | None:
    """An attempt's price per device-hour: its pool's, as recorded, else the run's."""
    return record["price_per_hour"] if record.get("price_per_hour") is not None else price_per_hour


def by_pool(records: list[dict], price_per_hour: float | None) -> dict[str, dict[str, Any]]:
    """Per work pool the attempts ran on (`unknown` for records from before pools
    were recorded, or off a deployment): attempts, device-hours, price, cost."""
    pools: dict[str, dict[str, Any]] = {}
    for r in records:
        price = _price(r, price_per_hour)
        part = pools.setdefault(str(r.get("pool") or "unknown"),
                                {"attempts": 0, "device_hours": 0.0, "price_per_hour": price, "cost": 0.0})
        hours = _wall_s(r) * int(r.get("devices") or 1) / 3600
        part["attempts"] += int(trained(r))
        part["device_hours"] += hours
        part["cost"] = None if price is None or part["cost"] is None else part["cost"] + price * hours
    return pools


def training_bill(records: list[dict], price_per_hour: float | None) -> dict[str, Any]:
    """The bill of one training run from its attempt records, oldest first;
    `price_per_hour` prices the attempts that recorded no price of their own."""
    device_hours = redone_hours = startup = step_s = data_wait = 0.0
    redone = timed = 0
    mfus: list[tuple[float, int]] = []
    ends: dict[str, int] = {}
    for i, r in enumerate(records):
        wall, devices = _wall_s(r), int(r.get("devices") or 1)
        device_hours += wall * devices / 3600
        # A rollback set `step` back: the steps it threw away were trained all the same.
        rolled_back = int(r.get("rolled_back_steps") or 0)
        steps = int(r.get("step") or 0) - int(r.get("resumed_from") or 0) + rolled_back
        n = _redone(r, records[i + 1] if i + 1 < len(records) else None) + rolled_back
        busy = max(0.0, wall - _startup_s(r))
        redone += n
        redone_hours += (busy / steps * n * devices / 3600) if steps > 0 else 0.0
        startup += _startup_s(r)
        data_wait += float(r.get("data_wait_s") or 0.0)
        step_s += float(r.get("step_s") or 0.0)
        timed += int(r.get("steps_timed") or 0)
        if r.get("mfu") is not None:
            mfus.append((float(r["mfu"]), int(r.get("steps_timed") or 0)))
        end = r.get("end") or "running"
        ends[end] = ends.get(end, 0) + 1
    weight = sum(w for _, w in mfus)
    pools = by_pool(records, price_per_hour)
    costs = [p["cost"] for p in pools.values()]
    return {
        "attempts": sum(1 for r in records if trained(r)),
        "device_hours": device_hours,
        "steps_redone": redone,
        "device_hours_redone": redone_hours,
        "startup_s": startup,
        "data_wait_s": data_wait,
        "cost": sum(costs) if costs and None not in costs else (0.0 if not costs and price_per_hour is not None
                                                                  else None),
        "price_per_hour": price_per_hour,
        "pools": pools,
        "ends": ends,
        "devices": [int(r.get("devices") or 1) for r in records],
        "device_types": sorted({str(r.get("device_name") or r.get("device_type")) for r in records}),
        "steps_per_second": timed / step_s if step_s > 0 else None,
        "mfu": sum(m * w for m, w in mfus) / weight if weight else None,
    }


POOL_METRICS = ("attempts", "device_hours", "cost")


def metrics(bill: dict[str, Any], keys: tuple[str, ...] = METRICS) -> dict[str, float]:
    """The bill as MLflow metrics under PREFIX, per pool under PREFIX/pools/<pool>/
    (what is unknown, e.g. a cost without a price, is left out rather than logged as 0)."""
    out = {PREFIX + k: float(bill[k]) for k in keys if bill.get(k) is not None}
    for pool, part in (bill.get("pools") or {}).items():
        if pool == "unknown":  # off a deployment (gpt2 run, gpt2 train): the totals say it all
            continue
        out.update({f"{PREFIX}pools/{pool}/{k}": float(part[k]) for k in POOL_METRICS if part.get(k) is not None})
    return out


def stage_hours(seconds: float, cached: bool) -> float:
    """A stage's machine-hours as its parent measured them (a cache hit ran nothing)."""
    return 0.0 if cached else seconds / 3600


def pipeline_bill(train: dict[str, Any] | None, cpu_hours: float, gpu_stage_hours: float,
                  price_per_hour: float | None, cpu_price_per_hour: float | None,
                  gpu_stage_pool: str | None = None) -> dict[str, Any]:
    """The pipeline's bill: the training run's (each attempt at its pool's price),
    plus the other GPU stages (evaluate, on `gpu_stage_pool`) at `price_per_hour`
    per device-hour, plus the CPU stages (data, export) at
    runtime.cpu_price_per_hour. `cost` sums the parts that have a price; null
    when none has one; `pools` adds the GPU stages' hours and cost per pool."""
    train = train or {}
    train_hours = float(train.get("device_hours") or 0.0)
    train_cost = train.get("cost") if train_hours else 0.0
    stage_cost = price_per_hour * gpu_stage_hours if price_per_hour is not None else None
    known = train_cost is not None and (stage_cost is not None or not gpu_stage_hours)
    gpu_cost = train_cost + (stage_cost or 0.0) if known and (train_hours or price_per_hour is not None) else None
    cpu_cost = cpu_price_per_hour * cpu_hours if cpu_price_per_hour is not None else None
    priced = [c for c in (gpu_cost, cpu_cost) if c is not None]
    pools = {pool: dict(part) for pool, part in (train.get("pools") or {}).items()}
    if gpu_stage_hours:
        part = pools.setdefault(gpu_stage_pool or "unknown", {"attempts": 0, "device_hours": 0.0,
                                                              "price_per_hour": price_per_hour, "cost": 0.0})
        part["device_hours"] += gpu_stage_hours
        part["cost"] = None if part["cost"] is None or stage_cost is None else part["cost"] + stage_cost
    return {
        "attempts": int(train.get("attempts") or 0),
        "device_hours": train_hours + gpu_stage_hours,
        "steps_redone": int(train.get("steps_redone") or 0),
        "device_hours_redone": float(train.get("device_hours_redone") or 0.0),
        "startup_s": float(train.get("startup_s") or 0.0),
        "data_wait_s": float(train.get("data_wait_s") or 0.0),
        "cpu_hours": cpu_hours,
        "gpu_cost": gpu_cost,
        "cpu_cost": cpu_cost,
        "cost": sum(priced) if priced else None,
        "pools": pools,
    }
