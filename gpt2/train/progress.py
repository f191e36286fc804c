"""What the trainer reports after each step, and a terminal progress bar.

The trainer calls `progress(StepInfo)` on rank 0; callers add their own
displays (the Prefect flow adds a progress artifact) by wrapping it.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Callable

from tqdm import tqdm

from gpt2.process.console import ConsoleStream


@dataclass(frozen=True)
class StepInfo:
    step: int
    """Optimizer steps completed."""
    max_steps: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_second: float
    mfu: float | None
    eta_seconds: float | None
    val_loss: float | None = None
    """Set on the steps where validation ran."""
    data_wait_seconds: float = 0.0
    """Time this step waited for its batches (shard downloads, checks), not counted in tokens/s."""

    @property
    def fraction(self) -> float:
        return self.step / self.max_steps

    def to_dict(self) -> dict:
        return asdict(self)


Progress = Callable[[StepInfo], None]


class ProgressBar:
    """tqdm on stderr: step/total, loss, tokens/s, ETA (tqdm's own). The bar is made at the first
    step, so its rate and ETA count training, not the preflight, the data's checks or the compile
    before it. On a console that survives its reader (gpt2.process.console) it owns its line: log
    lines are written above it, never into it."""

    def __init__(self, total: int, disable: bool | None = None):
        self.total, self.disable = total, disable  # disable=None: only on a terminal
        self.bar: tqdm | None = None
        self._console: ConsoleStream | None = None

    def _make(self, done: int) -> tqdm:
        stream = sys.stderr
        console = stream if isinstance(stream, ConsoleStream) else None
        bar = tqdm(total=self.total, initial=done, unit="step", dynamic_ncols=True, disable=self.disable,
                   file=console.bar_channel() if console is not None else stream)
        if console is not None and not bar.disable:
            console.bar, self._console = bar, console
        return bar

    def __call__(self, info: StepInfo) -> None:
        if self.bar is None:
            self.bar = self._make(max(info.step - 1, 0))
        self.bar.n = info.step
        postfix = {"loss": f"{info.loss:.4f}", "tok/s": f"{info.tokens_per_second:,.0f}"}
        if info.mfu is not None:
            postfix["mfu"] = f"{100 * info.mfu:.1f}%"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self._console is not None:
            self._console.bar, self._console = None, None
        if self.bar is not None:
            self.bar.close()
