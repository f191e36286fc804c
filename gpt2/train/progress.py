"""What the trainer reports after each step, and a terminal progress bar.

The trainer calls `progress(StepInfo)` on rank 0; callers add their own
displays (the Prefect flow adds a progress artifact) by wrapping it.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Callable

from tqdm import tqdm


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
    """tqdm on stderr: step/total, loss, tokens/s, ETA (tqdm's own)."""

    def __init__(self, total: int, initial: int = 0, disable: bool | None = None):
        # disable=None: only on a terminal, so logs of subprocesses stay clean.
        self.bar = tqdm(total=total, initial=initial, unit="step", file=sys.stderr,
                        dynamic_ncols=True, disable=disable)

    def __call__(self, info: StepInfo) -> None:
        self.bar.n = info.step
        postfix = {"loss": f"{info.loss:.4f}", "tok/s": f"{info.tokens_per_second:,.0f}"}
        if info.mfu is not None:
            postfix["mfu"] = f"{100 * info.mfu:.1f}%"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
