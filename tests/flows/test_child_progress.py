"""The parent's progress line for its training child (flows.child_progress);
tests/gpt2/train/test_attempts.py reads it from a real training run's record."""

from __future__ import annotations

import pytest

from flows import child_progress
from gpt2.config.overrides import resolve_config
from gpt2.root import layout, storage


def test_the_line_says_step_loss_speed_eta_and_pool():
    record = {"step": 120, "pool": "gpu-spot", "end": None,
              "progress": {"max_steps": 600, "loss": 5.21339, "tokens_per_second": 48213.4, "eta_s": 400.0}}
    assert child_progress.describe(record) == (
        "train: step 120/600, loss 5.2134, 48,213 tok/s, ETA 6m 40s (pool gpu-spot)")
    assert child_progress.describe({"step": None, "progress": None}) is None  # before the first step


def test_the_reporter_logs_at_most_every_interval_and_only_changes(tmp_path, monkeypatch):
    config = resolve_config("smoke", {"runtime.root": str(tmp_path / "root")})
    run_dir = layout.run_dir(config)
    lines: list[str] = []
    clock = [1000.0]
    monkeypatch.setattr(child_progress.time, "monotonic", lambda: clock[0])
    report = child_progress.reporter("train", config, lines.append, every_s=60)
    report()  # no attempt yet: nothing to say
    assert lines == []

    def write(step: int) -> None:
        storage.write_record(layout.attempt_record(run_dir, 1), {
            "attempt": 1, "step": step, "progress": {"max_steps": 40, "loss": 9.0 - step / 10,
                                                     "tokens_per_second": 1000.0, "eta_s": 30.0}})

    write(10)
    clock[0] += 61
    report()
    clock[0] += 10
    write(20)
    report()  # within the minute: nothing
    clock[0] += 60
    report()
    clock[0] += 60
    report()  # unchanged: nothing
    assert [line.split(",")[0] for line in lines] == ["train: step 10/40", "train: step 20/40"]
    write(40)
    clock[0] += 1
    report(final=True)  # the stage ended within the interval: its last line is said at once
    report(final=True)  # and once
    assert [line.split(",")[0] for line in lines][2:] == ["train: step 40/40"]
    assert child_progress.reporter("evaluate", config, lines.append) is None


@pytest.mark.parametrize("seconds,text", [(59, "0m 59s"), (3725, "1h 02m")])
def test_durations(seconds, text):
    assert child_progress._duration(seconds) == text
