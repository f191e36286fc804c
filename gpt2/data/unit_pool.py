"""This machine's executor of work units: a pool of worker processes, each
reading, tokenizing and writing whole units (gpt2.data.units), so the
coordinating process only sends unit descriptions (a few hundred bytes) and
receives results of the same size.

    executor = UnitPool(config, directory, workers=4)
    for result in executor.map(plan_units(source, config.runtime.tokenize_part_tokens)): ...

A dead worker is an error naming its pid, its signal and its unit within
about a second (gpt2.data.process_pool); bad input in a unit is raised as the
same SourceError a single process gives. A worker encodes its next unit
while the last one's bytes, rename and record reach the disk (Finish in
gpt2.data.process_pool): on a busy disk a unit's fsyncs were measured to wait
~25 ms, as long as encoding 256 KB takes. With one worker, units run in this
process.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path

from gpt2.config.tree import Config
from gpt2.data.process_pool import Finish, default_workers, run_pool
from gpt2.data.tokenize_pool import warm_up
from gpt2.data.units import encode_unit, tokenize_unit
from gpt2.data.work_unit import Unit, UnitResult

WINDOW_PER_WORKER = 4
"""Units handed out per worker ahead of the oldest unfinished one: enough that
no worker idles behind a slower unit, few enough that a stop (limits met)
wastes little."""


AHEAD_PER_WORKER = 3
"""Units sent to a worker before its oldest result comes back: one finishing
on the disk, one being encoded, one waiting."""


def _run(config: Config, directory: str, unit: Unit) -> Finish:
    return Finish(encode_unit(config, unit, directory))


class UnitPool:
    """UnitExecutor on `workers` processes of this machine (0: every core)."""

    def __init__(self, config: Config, directory: str | Path, workers: int = 0):
        self.config, self.directory = config, str(directory)
        self.workers = workers or default_workers()

    def map(self, units: Iterable[Unit]) -> Iterator[UnitResult]:
        if self.workers == 1:
            for unit in units:
                yield tokenize_unit(self.config, unit, self.directory)
            return
        jobs = ((unit, unit) for unit in units)
        fn = partial(_run, self.config, self.directory)
        for _, result in run_pool(fn, jobs, self.workers, WINDOW_PER_WORKER * self.workers, warm_up,
                                     AHEAD_PER_WORKER):
            yield result
