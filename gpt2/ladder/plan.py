"""The ladder of GPU pools in `gpt2 plan` (runtime.gpu_pools): what the run
would take and cost on each rung, before anything is rented.

Where capacity will be is not known ahead, so each rung is priced as if the
whole run trained there: the plan's device-hours times the rung's price per
device-hour (gpt2.ladder.rungs.price_for: the rung's own, else
runtime.price_per_hour, else `--price-per-hour` split over the GPUs). The last
rung's row is the cost if the run ends there; `waits_before_s` is the time the
run can lose reaching a rung when no rung above it ever starts it (their
start_timeout_s added up).
"""

from __future__ import annotations

from typing import Any

from gpt2.config.tree import Config
from gpt2.ladder.rungs import price_for


def _price(config: Config, pool: str, machine_price: float | None, gpus: int) -> float | None:
    """One device-hour on `pool`, with the command's whole-machine price as the last fallback."""
    price = price_for(config, pool)
    if price is None and machine_price is not None:
        price = machine_price / gpus
    return price


def rungs(config: Config, plan: dict[str, Any], machine_price: float | None) -> list[dict[str, Any]]:
    """One row per rung, in the ladder's order: {pool, price_per_hour (one
    device), hours, device_hours, cost (None without a price),
    start_timeout_s, max_preemptions, waits_before_s}."""
    rows, waited = [], 0.0
    for rung in config.runtime.gpu_pools:
        price = _price(config, rung.pool, machine_price, plan["gpus"])
        rows.append({
            "pool": rung.pool,
            "price_per_hour": price,
            "hours": plan["hours"],
            "device_hours": plan["gpu_hours"],
            "cost": plan["gpu_hours"] * price if price is not None else None,
            "start_timeout_s": rung.start_timeout_s,
            "max_preemptions": rung.max_preemptions,
            "waits_before_s": waited,
        })
        waited += rung.start_timeout_s
    return rows


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _leaves(row: dict[str, Any], last: bool) -> str:
    if last:
        return "last rung: waits runtime.stage_start_timeout_s, then the stage fails"
    return f"left after {row['start_timeout_s']:.0f} s not started, or {row['max_preemptions']} preemption(s)"


def describe(rows: list[dict[str, Any]]) -> str:
    """The ladder as text for people: a line per rung, then the cost if the run ends on the last one."""
    width = max(len(r["pool"]) for r in rows)
    lines = ["ladder of GPU pools (runtime.gpu_pools), each rung priced as if the whole run trained there:"]
    for i, r in enumerate(rows):
        price = f"{_money(r['price_per_hour'])}/device-h"
        lines.append(f"  {r['pool']:<{width}}  {price:>16}  {r['hours']:,.2f} h  cost {_money(r['cost']):>10}  "
                     f"({_leaves(r, i == len(rows) - 1)})")
    last = rows[-1]
    lines.append(f"  if the run ends on {last['pool']} (all of it there): cost {_money(last['cost'])}, "
                 f"{last['hours']:,.2f} h after up to {last['waits_before_s'] / 60:,.0f} min waiting on the rungs above")
    if any(r["price_per_hour"] is None for r in rows):
        lines.append("  cost: give each rung a price (runtime.gpu_pools=POOL:PRICE,...), or set "
                     "runtime.price_per_hour or --price-per-hour")
    return "\n".join(lines)
