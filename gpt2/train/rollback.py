"""Rolling back past a loss spike (train.on_spike=rollback): back to the newest
checkpoint before the spike, the data stepped past every batch trained since.

A rollback is written down before training goes on, as a small record in the
directory of the checkpoint it went back to:

    <run>/checkpoints/step_000400/rollback_0001.json
    {"rollback": 1, "at_step": 437, "to_step": 400,
     "data_from": {"shard": 3, "offset": 0, "epoch": 0}, "data_to": {"shard": 3, "offset": 19398656, "epoch": 0},
     "verdict": {"step": 437, "loss": 5.1, "loss_z": 41.0, ...}}

Resuming from that checkpoint applies its records in order (`folded`): the
loader starts at the last record's `data_to`, the events include them. So a
run killed anywhere during or after a rollback goes on exactly as the
uninterrupted one: killed before the record, it trains to the same spike and
rolls back again; killed after, it resumes past the skipped batches. The
records live and go with their checkpoint (pruning, --fresh), and rollbacks
to one checkpoint happen only while it is the newest, so all of them come
after its own state.
"""

from __future__ import annotations

import re

from gpt2.root import storage

_RECORD = re.compile(r"^rollback_(\d{4,})\.json$")


def record_url(checkpoint_url: str, number: int) -> str:
    return storage.join(checkpoint_url, f"rollback_{number:04d}.json")


def read_records(checkpoint_url: str) -> list[dict]:
    """The rollbacks to this checkpoint, oldest first."""
    names = sorted((int(m.group(1)), name) for name in storage.list_dir(checkpoint_url)
                   if (m := _RECORD.match(name)))
    records = [storage.read_record(storage.join(checkpoint_url, name)) for _, name in names]
    return [r for r in records if isinstance(r, dict)]


def folded(state: dict, records: list[dict]) -> dict:
    """A checkpoint's state with its rollbacks applied: the data position past
    the skipped batches and the rollback events added to the spike events."""
    if not records:
        return state
    spikes = dict(state.get("spikes") or {})
    spikes["events"] = list(spikes.get("events", [])) + [rollback_event(r) for r in records]
    return {**state, "loader": dict(records[-1]["data_to"]), "spikes": spikes}


def rollback_event(record: dict) -> dict:
    return {**record["verdict"], "action": "rollback", "to_step": record["to_step"],
            "data_from": record["data_from"], "data_to": record["data_to"]}


def newest_before(complete: list[str], step: int) -> str | None:
    """Of the complete checkpoints (newest first), the newest written before `step`."""
    for url in complete:
        if int(url.rstrip("/").rsplit("step_", 1)[1]) < step:
            return url
    return None


def describe_position(position: dict) -> str:
    return f"epoch {position['epoch']} shard {position['shard']} offset {position['offset']}"


def describe(event: dict) -> str:
    """One rollback, as the error names it: the steps and the data skipped."""
    return (f"step {event['step']} -> {event['to_step']}, data skipped from "
            f"{describe_position(event['data_from'])} to {describe_position(event['data_to'])}")


def too_many(verdict_text: str, events: list[dict], limit: int) -> str:
    """The error of a spike past train.max_rollbacks: every rollback's steps and data."""
    rollbacks = [e for e in events if e.get("action") == "rollback"]
    made = "; ".join(describe(e) for e in rollbacks) or "none"
    return (f"loss spike at {verdict_text} after train.max_rollbacks={limit} rollback(s) ({made}): the run keeps "
            "diverging, so it stops here rather than train on; lower train.lr, raise train.warmup_steps or "
            "train.max_rollbacks, or inspect the data at those positions")
