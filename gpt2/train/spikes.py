"""Loss spikes: each step's loss and gradient norm against their recent history.

A robust z-score (llm.c's detector, PR #637, with the median and the median
absolute deviation in place of the mean and standard deviation, so one spike
in the window does not hide the next): `(value - median) / (1.4826 * MAD)`
over the last `train.spike_window` steps. A step whose loss or gradient norm
lies more than `train.spike_zscore` above is a spike, and so is a step whose
loss or norm is not finite; only upward outliers count (a falling loss is
the point of training). Nothing is judged until the window is full.

Both numbers come from the step's one host read (gpt2.train.step): the
detector costs a median of a few hundred floats on the host per step, not a
device sync (bench/spike_detector.py).

The window and the events so far are part of every checkpoint's state, so a
resumed run judges its next steps exactly as the uninterrupted one would.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass

MAD_TO_SIGMA = 1.4826
"""The MAD of a normal distribution times this is its standard deviation."""

SCALE_FLOOR = 1e-3
"""The smallest spread the z-score divides by, as a fraction of the median: a
window of identical values (MAD 0) must not make every wobble a spike."""


def robust_z(window: list[float], value: float) -> float:
    """How many robust standard deviations `value` lies above the window's median."""
    if not math.isfinite(value):
        return math.inf
    median = statistics.median(window)
    mad = statistics.median(abs(v - median) for v in window)
    scale = max(MAD_TO_SIGMA * mad, SCALE_FLOOR * abs(median), 1e-12)
    return (value - median) / scale


@dataclass(frozen=True)
class Verdict:
    """One step as the detector judged it."""

    step: int
    loss: float
    grad_norm: float
    loss_z: float
    grad_norm_z: float
    spike: bool

    def describe(self) -> str:
        return (f"step {self.step}: loss {self.loss:.4f} (z {self.loss_z:.1f}), "
                f"grad norm {self.grad_norm:.3f} (z {self.grad_norm_z:.1f})")

    def to_dict(self) -> dict:
        # JSON has no infinity: a non-finite value is written as a string.
        return {k: v if not isinstance(v, float) or math.isfinite(v) else str(v) for k, v in asdict(self).items()}


class SpikeDetector:
    """The window of the last steps' losses and gradient norms, and the verdict on each new step."""

    def __init__(self, zscore: float, window: int):
        self.zscore, self.size = zscore, window
        self.losses: deque[float] = deque(maxlen=window)
        self.norms: deque[float] = deque(maxlen=window)

    @property
    def enabled(self) -> bool:
        return self.zscore > 0

    def judge(self, step: int, loss: float, grad_norm: float) -> Verdict | None:
        """The verdict on `step` (None: detection off, or the window not yet
        full and the numbers finite), then its numbers join the window.
        Every finite step joins, spikes too, as in llm.c: a loss that moved to
        a new level for good is a spike for a while, not for ever."""
        verdict = None
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        if self.enabled and (len(self.losses) == self.size or not finite):
            loss_z = robust_z(list(self.losses), loss) if self.losses else (0.0 if math.isfinite(loss) else math.inf)
            norm_z = (robust_z(list(self.norms), grad_norm) if self.norms
                      else (0.0 if math.isfinite(grad_norm) else math.inf))
            verdict = Verdict(step, loss, grad_norm, loss_z, norm_z, max(loss_z, norm_z) > self.zscore)
        if finite:
            self.losses.append(loss)
            self.norms.append(grad_norm)
        return verdict

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "grad_norms": list(self.norms)}

    def load_state_dict(self, state: dict) -> None:
        self.losses = deque(state.get("losses", []), maxlen=self.size)
        self.norms = deque(state.get("grad_norms", []), maxlen=self.size)


ACTIONS = {"warn": "warned", "skip": "skipped", "rollback": "rollback"}
"""train.on_spike -> the action its events are recorded under."""


class Spikes:
    """A run's detector and its spike events: what its checkpoints keep of them
    (`state_dict`), and what the summary counts."""

    def __init__(self, zscore: float, window: int, policy: str, state: dict | None = None):
        self.policy, self.detector = policy, SpikeDetector(zscore, window)
        state = state or {}
        self.detector.load_state_dict(state.get("window", {}))
        self.events: list[dict] = list(state.get("events", []))
        self.last: Verdict | None = None

    @classmethod
    def of_run(cls, train, state: dict) -> Spikes:
        """The run's, from its config's train section and a checkpoint's state (or {})."""
        return cls(train.spike_zscore, train.spike_window, train.on_spike, state.get("spikes"))

    @property
    def skips_updates(self) -> bool:
        """The step must ask before its optimizer steps (`keep_update`)."""
        return self.detector.enabled and self.policy == "skip"

    @property
    def rolls_back(self) -> bool:
        return self.detector.enabled and self.policy == "rollback"

    def judge(self, step: int, loss: float, grad_norm: float) -> Verdict | None:
        self.last = self.detector.judge(step, loss, grad_norm)
        return self.last

    def keep_update(self, step: int):
        """For gpt2.train.step: judge `step` on the numbers read before the
        optimizer steps; False (a spike) drops the update."""
        def keep(loss: float, grad_norm: float) -> bool:
            verdict = self.judge(step, loss, grad_norm)
            return verdict is None or not verdict.spike
        return keep

    def event(self, verdict: Verdict, **more) -> dict:
        """The event of a spike under this run's policy (kept; a rollback's is
        kept by the records it writes, gpt2.train.rollback)."""
        event = {**verdict.to_dict(), "action": ACTIONS[self.policy], **more}
        if self.policy != "rollback":
            self.events.append(event)
        return event

    def rollbacks(self) -> int:
        return sum(1 for e in self.events if e.get("action") == "rollback")

    def counts(self) -> dict[str, int]:
        """Events of the run so far by action: warned, skipped, rollbacks."""
        actions = [e.get("action") for e in self.events]
        return {"warned": actions.count("warned"), "skipped": actions.count("skipped"),
                "rollbacks": actions.count("rollback")}

    def state_dict(self) -> dict:
        return {"window": self.detector.state_dict(), "events": [dict(e) for e in self.events]}
