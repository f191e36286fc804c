"""What one session of the training loop (gpt2.train.loop.Loop.run) ends with;
gpt2.train.run turns it into the run's TrainResult."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    run_name: str
    checkpoint: str | None
    steps: int
    train_loss: float | None
    val_loss: float | None
    tokens_per_second: float
    mlflow_run_id: str | None
    preempted: bool = False
    spikes: dict | None = None  # loss spikes by action (gpt2.train.spikes.Spikes.counts)
    skipped_steps: int | None = None  # steps fp16's loss scaler skipped (None: no scaler)
