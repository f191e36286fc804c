"""A parent flow's view of its training child while it waits on it: every
EVERY_S at most, one line from the run's newest attempt record (written by the
trainer with each heartbeat: gpt2.train.attempts), and the last one once the
stage has ended, so `prefect deployment run gpt2/full-pipeline --watch` (which
streams the parent's logs), `prefect flow-run logs` and the UI show a pipeline
that is alive and where its training got to, without opening the child run.

    train: step 120/600, loss 5.2134, 48,213 tok/s, ETA 6m 40s (pool gpu-spot)

Read from the root, never from the child's log lines (STYLE 15); torch-free,
as the parent is.
"""

from __future__ import annotations

import time
from typing import Callable

from gpt2.config.tree import Config
from gpt2.root import layout, storage

EVERY_S = 15.0
"""A line at most this often, and only when the record changed (it changes every runtime.heartbeat_s)."""


def newest_attempt(run_dir: str) -> dict | None:
    """The run's newest attempt record (None before the first, or if unreadable)."""
    directory = layout.attempts_dir(run_dir)
    names = sorted(n for n in storage.list_dir(directory) if n.endswith(".json") and n[:-5].isdigit())
    record = storage.read_record(storage.join(directory, names[-1])) if names else None
    return record if isinstance(record, dict) else None


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def describe(record: dict) -> str | None:
    """One progress line from an attempt record; None before its first step."""
    progress, step = record.get("progress"), record.get("step")
    if not progress or step is None:
        return None
    line = f"train: step {step}/{progress['max_steps']}, loss {progress['loss']:.4f}"
    if progress.get("tokens_per_second"):
        line += f", {progress['tokens_per_second']:,.0f} tok/s"
    if progress.get("eta_s") is not None:
        line += f", ETA {_duration(progress['eta_s'])}"
    if record.get("end"):
        line += f" ({record['end']})"
    return line + (f" (pool {record['pool']})" if record.get("pool") else "")


def reporter(stage: str, config: Config, log: Callable[[str], None],
             every_s: float = EVERY_S) -> Callable[..., None] | None:
    """A callable for the parent's wait loop that logs the training child's
    progress at most every `every_s` seconds, and only when it changed; called
    with `final=True` once the stage has ended, it says the last line now (a
    short run would otherwise end between two lines). None for the other stages."""
    if stage != "train":
        return None
    run_dir, last = layout.run_dir(config), {"at": 0.0, "line": None}

    def report(final: bool = False) -> None:
        if not final and time.monotonic() - last["at"] < every_s:
            return
        last["at"] = time.monotonic()
        try:
            record = newest_attempt(run_dir)
        except Exception:  # noqa: BLE001 - a progress line is never worth failing the pipeline for
            return
        line = describe(record) if record else None
        if line and line != last["line"]:
            last["line"] = line
            log(line)

    return report
