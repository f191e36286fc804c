"""What a checkpoint's state.json holds of the training loop
(gpt2.train.loop.Loop) at a step: enough to resume exactly from it."""

from __future__ import annotations

from datetime import datetime, timezone

from gpt2.config.identity import train_fingerprint


def checkpoint_state(loop, done: int) -> dict:
    """Rank 0's state of the checkpoint of step `done`."""
    return {
        "step": done,
        "config": loop.cfg.model_dump(mode="json"),
        "train_fingerprint": train_fingerprint(loop.cfg),
        "run_name": loop.run_name,
        "loader": loop.s.loader.state_dict(),
        "mlflow_run_id": loop.tracker.run_id,
        # The metric points MLflow does not have yet (it is away, or they wait
        # for the next batch): a resumed attempt sends them, so a kill after
        # this checkpoint leaves no gap in the run's curves.
        "tracking_backlog": loop.tracker.unsent_points(),
        "train_loss": loop.train_loss,
        "val_loss": loop.val_loss,
        "val_loss_step": loop.history["val"][-1][0] if loop.history["val"] else None,
        "tokens_seen": done * loop.cfg.train.total_batch_tokens,
        "tokens_per_second": loop.throughput.tokens_per_second or loop.saved_tps,
        "micro_batch_size": loop.s.micro_batch,
        "world_size": loop.s.env.world_size,
        "saved_at": datetime.now(timezone.utc).isoformat(),
        # Copied: the writer thread serializes this while the loop appends.
        "history": {k: [list(p) for p in v] for k, v in loop.history.items()},
        "spikes": loop.spikes.state_dict(),
        # fp16's loss scaler (gpt2.train.precision): its scale resumes exactly; None in bf16 and fp32.
        "precision": loop.s.precision.name if loop.s.precision else None,
        "loss_scaler": loop.s.ctx.scaler.state_dict() if loop.s.ctx.scaler is not None else None,
    }
