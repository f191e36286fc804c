"""An attempt's start-up, part by part (the attempt record's `startup_parts`,
MLflow's `startup/<part>`), so a slow restart says where its seconds went:

    imports     the process's start to the trainer's entry (interpreter, torch)
    lease       taking the run's lease
    data        the manifest, the shards' check, the loader and the validation batches
    checkpoint  choosing, reading and restoring the checkpoint (weights, optimizer, RNG)
    probe       the micro-batch search (train.micro_batch_size=auto)
    compile     loading the saved compiled program, compiling on stand-in batches (gpt2.train.step.warm_up)
                while the first shards download, and the first step's time beyond a steady step's
    first_step  the rest of the first step (about one steady step)
    other       the rest: the process group, the model's build, the attempt's own records

They add up to the attempt's start-up, the process's start to its first step's end.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import psutil

PARTS = ("imports", "lease", "data", "checkpoint", "probe", "compile", "first_step", "other")


def process_started() -> float:
    """When this process started (Unix seconds)."""
    return psutil.Process().create_time()


class StartupParts:
    def __init__(self, entered: float):
        self.started = process_started()
        self.seconds = {"imports": max(0.0, entered - self.started)}
        self.first: float | None = None

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def first_step(self, seconds: float, ended_at: float) -> None:
        """The first step took `seconds` and ended at `ended_at`: until a second
        step says how much of it was compilation, all of it is `first_step`."""
        self.first, self.ended_at = seconds, ended_at
        self.seconds["first_step"] = seconds

    def steady_step(self, seconds: float, compiling: bool) -> None:
        """A steady step's time: what the first step took beyond it was compilation."""
        if self.first is None or not compiling:
            return
        extra = max(0.0, self.first - seconds)
        self.add("compile", extra)
        self.seconds["first_step"] = self.first - extra

    def as_dict(self) -> dict[str, float]:
        named = {p: round(self.seconds.get(p, 0.0), 3) for p in PARTS if p != "other"}
        whole = (self.ended_at - self.started) if self.first is not None else sum(named.values())
        return {**named, "other": round(max(0.0, whole - sum(named.values())), 3)}
