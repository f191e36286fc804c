"""What a sweep ends with: a row per member (its overrides, state, final val loss, HellaSwag
when evaluated, CORE when asked, tokens, device-hours, cost), the best marked, failures with their one-line
reason, and the sweep's bill by pool.

The bill of a member is its run's, from the run's attempt records (gpt2.train.bill): a member
answered from an existing run shows what that run cost when it trained, and adds it to the
sweep's total as well, so the total is what the table's runs cost, wherever they were trained.
"""

from __future__ import annotations

import math
import re
from typing import Any

from gpt2.sweep.members import Member

STATES = ("trained", "cached", "failed")
"""A member's state: trained by this sweep, answered from its finished run, or failed."""
_STEP = re.compile(r"step_(\d+)/?$")


def member_bill(member: Member) -> dict[str, Any]:
    """The member's run's bill from its attempt records (none yet: zero hours)."""
    from gpt2.train.attempts import read_attempts
    from gpt2.train.bill import training_bill

    return training_bill(read_attempts(member.run_dir), member.config.runtime.price_per_hour)


def _steps(checkpoint: str | None) -> int | None:
    match = _STEP.search(checkpoint or "")
    return int(match.group(1)) if match else None


def member_row(member: Member, result: dict[str, Any] | None, error: str | None,
               bill: dict[str, Any] | None) -> dict[str, Any]:
    """One member's row: `result` is its pipeline's summary (flows.pipeline.summarize), or
    None when it failed with `error` (one line)."""
    result = result or {}
    steps = _steps(result.get("checkpoint"))
    hellaswag = (result.get("hellaswag") or {}).get("acc_norm")
    state = "failed" if error is not None else ("cached" if "train" in (result.get("cached_stages") or ()) else
                                                "trained")
    bill = bill or {}
    return {
        "member": member.index,
        "overrides": member.overrides,
        "label": member.label,
        "run": member.run_name,
        "state": state,
        "reason": error.splitlines()[0] if error else None,
        "final_val_loss": result.get("final_val_loss"),
        "hellaswag": hellaswag,
        "core": (result.get("core") or {}).get("score"),  # when eval.tasks asks for CORE
        "tokens": steps * member.config.train.total_batch_tokens if steps is not None else None,
        "device_hours": float(bill.get("device_hours") or 0.0),
        "cost": bill.get("cost"),
        "pools": {p: dict(part) for p, part in (bill.get("pools") or {}).items()},
        "mlflow_run_id": result.get("mlflow_run_id"),
        "train_mlflow_run_id": (result.get("stage_mlflow_run_ids") or {}).get("train"),
        "checkpoint": result.get("checkpoint"),
        "best": False,
    }


def mark_best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The member with the lowest final val loss among those that finished (the first on a
    tie), marked `best`; None when none finished with a loss."""
    done = [r for r in rows if r["state"] != "failed" and r["final_val_loss"] is not None
            and math.isfinite(r["final_val_loss"])]
    for r in rows:
        r["best"] = False
    if not done:
        return None
    best = min(done, key=lambda r: r["final_val_loss"])
    best["best"] = True
    return best


def sweep_bill(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The members' bills added up, in total and by pool; `cost` is None when a member
    that spent device-hours has no price (a partial sum would look like the whole)."""
    pools: dict[str, dict[str, Any]] = {}
    for r in rows:
        for pool, part in r["pools"].items():
            into = pools.setdefault(pool, {"attempts": 0, "device_hours": 0.0, "cost": 0.0})
            into["attempts"] += int(part.get("attempts") or 0)
            into["device_hours"] += float(part.get("device_hours") or 0.0)
            into["cost"] = None if into["cost"] is None or part.get("cost") is None else into["cost"] + part["cost"]
    unpriced = any(r["cost"] is None and r["device_hours"] > 0 for r in rows)
    return {
        "members": len(rows),
        "device_hours": sum(r["device_hours"] for r in rows),
        "cost": None if unpriced else sum(r["cost"] or 0.0 for r in rows),
        "pools": pools,
    }


def _fig(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def describe(rows: list[dict[str, Any]], bill: dict[str, Any]) -> str:
    """The table for people: a line per member, `*` on the best, then the failures' reasons and the bill."""
    core = any(r.get("core") is not None for r in rows)  # a column only when some member was scored
    head = ("", "#", "state", "val loss", "HellaSwag", *(("CORE",) if core else ()), "tokens", "dev-hours", "cost",
            "overrides")
    lines = [(("*" if r["best"] else ""), str(r["member"]), r["state"], _fig(r["final_val_loss"], ".4f"),
              _fig(r["hellaswag"], ".4f"), *((_fig(r.get("core"), ".4f"),) if core else ()), _fig(r["tokens"], ","),
              _fig(r["device_hours"], ".4f"), _fig(r["cost"], ",.2f"), r["label"]) for r in rows]
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head) - 1)]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1] for line in [head, *lines]]
    text += [f"member {r['member']} failed: {r['reason']}" for r in rows if r["state"] == "failed"]
    cost = f"{bill['cost']:,.2f}" if bill["cost"] is not None else "unknown (set runtime.price_per_hour)"
    text.append(f"bill: {bill['members']} member(s), {bill['device_hours']:,.4f} device-hours, cost {cost}")
    for pool, part in bill["pools"].items():
        if pool == "unknown":  # off a deployment (in this process): the total says it all
            continue
        text.append(f"  {pool}: {part['attempts']} attempt(s), {part['device_hours']:,.4f} device-hours, cost "
                    + (f"{part['cost']:,.2f}" if part["cost"] is not None else "unknown"))
    return "\n".join(text)
