"""The JSON-lines status file through which a trainer in a child process
(`python -m gpt2.train --status PATH`, rank 0) reports to the launcher that
started it (gpt2.launch.torchrun): one event per line, `step`, then exactly
one of `done`, `preempted` or `error`. Its format lives here, with the
trainer that writes it, so the launchers read it without the trainer
importing them.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpt2.train.progress import StepInfo


class StatusFile:
    """The JSON-lines status file a torchrun child's rank 0 writes and its parent reads."""

    def __init__(self, path: Path):
        self.path, self._offset = path, 0

    def write(self, event: str, **fields) -> None:
        # One write per line, flushed: a reader sees whole lines or none of a line.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, **fields}) + "\n")

    def step(self, info: StepInfo) -> None:
        self.write("step", **info.to_dict())

    def read_new(self) -> list[dict]:
        """Events appended since the last call (a torn last line waits for the next call)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def step_info(event: dict) -> StepInfo:
    return StepInfo(**{k: v for k, v in event.items() if k != "event"})
