"""A sweep priced before it runs (`gpt2 plan --grid …`): each member's plan (gpt2.cost.plan),
their device-hours and cost added up, and the wall time with at most `parallel` members
training at once, queued in member order as the sweep starts them."""

from __future__ import annotations

import heapq
from typing import Any


def queued_hours(hours: list[float], parallel: int) -> float:
    """Wall hours of jobs of `hours` run in order on `parallel` slots, each job taking the
    slot that frees first (how the sweep starts its members)."""
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {parallel}")
    slots = [0.0] * min(parallel, max(1, len(hours)))
    for h in hours:
        heapq.heappush(slots, heapq.heappop(slots) + h)
    return max(slots)


def price_sweep(labels: list[str], plans: list[dict[str, Any]], parallel: int) -> dict[str, Any]:
    """The sweep's part of `gpt2 plan --json` (`sweep`): per member its steps, hours,
    GPU-hours and cost; in total GPU-hours, cost (None when a plan has none) and wall hours
    at the parallelism."""
    members = [{"member": i, "overrides": label, "steps": p["steps"], "hours": p["hours"],
                "gpu_hours": p["gpu_hours"], "cost": p["cost"]} for i, (label, p) in enumerate(zip(labels, plans), 1)]
    costs = [p["cost"] for p in plans]
    return {
        "members": members,
        "parallel": parallel,
        "gpu_hours": sum(p["gpu_hours"] for p in plans),
        "cost": None if None in costs else sum(costs),
        "wall_hours": queued_hours([p["hours"] for p in plans], parallel),
    }


def describe(sweep: dict[str, Any]) -> str:
    cost = f"{sweep['cost']:,.2f}" if sweep["cost"] is not None else "no --price-per-hour given"
    head = (f"sweep: {len(sweep['members'])} member(s), at most {sweep['parallel']} training at once "
            "(runtime.max_parallel_runs, or the GPU pool's slots if fewer)")
    lines = [head]
    lines += [f"  member {m['member']}: {m['steps']:,} steps, {m['gpu_hours']:,.2f} GPU-hours"
              + (f", cost {m['cost']:,.2f}" if m["cost"] is not None else "") + f"  ({m['overrides']})"
              for m in sweep["members"]]
    lines.append(f"  total: {sweep['gpu_hours']:,.2f} GPU-hours, cost {cost}, ~{sweep['wall_hours']:,.2f} h of wall "
                 "time (training only; the data stage once per data config)")
    return "\n".join(lines)
