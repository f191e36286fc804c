"""A run's plan beside what it measured (`gpt2 plan --run RUN`, or the same
preset and overrides after a run): steps/s, MFU, device-hours, cost and
attempts, estimated (gpt2.cost.plan) and from the run's attempt records (gpt2.train.bill).

The measured steps/s and MFU are the steady steps' (the first step of each
attempt, warm-up and compilation, is left out, as the estimate leaves it out);
device-hours and cost are the whole bill, start-up and redone steps included,
which the estimate does not count: the difference is what they cost.
"""

from __future__ import annotations

from typing import Any

from gpt2.checkpoint import catalog
from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.root import layout, storage
from gpt2.train.attempts import read_attempts
from gpt2.train.bill import training_bill

ROWS = ("steps_per_second", "mfu", "device_hours", "cost", "attempts")


def run_dir_of(config: Config, run: str | None) -> str:
    """RUN as a URL (a run directory) or a name under the root's runs/; None: the config's own run."""
    if run is None:
        return layout.run_dir(config)
    return storage.normalize_url(run) if "://" in run else layout.run_dir_under(layout.root(config), run)


def run_config(config: Config, run: str) -> Config:
    """The settings RUN trained with (its newest checkpoint's), with this
    command's runtime section: where the root is now and what an hour costs."""
    run_dir = run_dir_of(config, run)
    latest = catalog.latest_checkpoint(run_dir)
    state = storage.read_record(storage.join(latest, "state.json")) if latest else None
    if not state or "config" not in state:
        if read_attempts(run_dir):  # attempts, no checkpoint yet: the command's own settings stand
            return config
        raise UserError(f"no training run at {run_dir}: no checkpoint and no attempt records; name a run "
                        f"under {layout.runs_dir(config)} (gpt2 train --json prints its run_name)")
    saved = Config.model_validate(state["config"])
    return saved.model_copy(update={"runtime": config.runtime})


def devices_of(config: Config, run: str) -> int | None:
    """The devices the run's latest attempt trained on (the plan's default GPU count for it)."""
    records = read_attempts(run_dir_of(config, run))
    return int(records[-1].get("devices") or 1) if records else None


def price_per_device(config: Config, machine_price: float | None, gpus: int) -> float | None:
    """runtime.price_per_hour, else `gpt2 plan --price-per-hour` (the whole machine) split over its GPUs."""
    if config.runtime.price_per_hour is not None:
        return config.runtime.price_per_hour
    return machine_price / gpus if machine_price is not None else None


def compare(config: Config, plan: dict[str, Any], run: str | None, price: float | None) -> dict[str, Any] | None:
    """{"run", "run_dir", "steps_trained", "devices", "device_types", "rows": {row: {"estimate", "measured"}}}
    for the run's attempt records; None when the config's own run has none yet, or
    lives in a remote root (unasked, `gpt2 plan` stays offline)."""
    if run is None and layout.local_root(config) is None:
        return None
    run_dir = run_dir_of(config, run)
    records = read_attempts(run_dir)
    if not records:
        if run is not None:
            raise UserError(f"run {run_dir} has no attempt records (runs trained before they were kept have "
                            "none): nothing measured to compare with")
        return None
    bill = training_bill(records, price)
    estimate = {
        "steps_per_second": plan["tokens_per_second"] / plan["total_batch_tokens"],
        "mfu": plan["assumed_mfu"],
        "device_hours": plan["gpu_hours"],
        "cost": price * plan["gpu_hours"] if price is not None else None,
        "attempts": 1,
    }
    return {
        "run": run_dir.rstrip("/").rsplit("/", 1)[-1],
        "run_dir": run_dir,
        "steps_trained": max(int(r.get("step") or 0) for r in records),
        "devices": bill["devices"],
        "device_types": bill["device_types"],
        "price_per_device_hour": price,
        "bill": bill,
        "rows": {k: {"estimate": estimate[k], "measured": bill[k]} for k in ROWS},
    }


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "mfu":
        return f"{value:.1%}"
    if key == "attempts":
        return str(value)
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3g}"  # small runs keep their digits


def describe(actual: dict[str, Any], planned_steps: int) -> str:
    """The comparison as text for people."""
    labels = {"steps_per_second": "steps/s", "mfu": "MFU", "device_hours": "device-hours", "cost": "cost",
              "attempts": "attempts"}
    where = f"{' / '.join(actual['device_types'])} x {' / '.join(map(str, sorted(set(actual['devices']))))}"
    lines = [f"measured: run {actual['run']}, {actual['steps_trained']:,} of {planned_steps:,} steps, on {where}",
             f"  {'':<14}{'estimate':>14}{'measured':>14}"]
    lines += [f"  {labels[k] + ':':<14}{_fmt(k, r['estimate']):>14}{_fmt(k, r['measured']):>14}"
              for k, r in actual["rows"].items()]
    b = actual["bill"]
    lines.append(f"  measured includes {b['startup_s']:,.0f} s of start-up and {b['steps_redone']} steps redone "
                 f"({b['device_hours_redone']:,.2f} device-hours); the estimate counts neither")
    if actual["price_per_device_hour"] is None:
        lines.append("  cost: set runtime.price_per_hour (one device for an hour) or --price-per-hour")
    return "\n".join(lines)
