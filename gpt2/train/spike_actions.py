"""What a loss spike does to a running training loop (train.on_spike; the
detector is gpt2.train.spikes): its event told (the log, MLflow at its step,
the attempt record), and a rollback made (gpt2.train.rollback): back to the
newest checkpoint before the spike on every rank, the data past every batch
trained since. Functions of the loop (gpt2.train.loop.Loop) they act on."""

from __future__ import annotations

import logging

from gpt2.checkpoint import catalog, store
from gpt2.checkpoint.optim_load import rank_state
from gpt2.root import storage
from gpt2.train import rollback
from gpt2.train.optim import load_state
from gpt2.train.restore import restore_rng, shared_checkpoint
from gpt2.train.session import Session, TrainingError
from gpt2.train.spikes import Spikes, Verdict

log = logging.getLogger(__name__)


def restore(session: Session, ckpt: store.Checkpoint) -> None:
    """Put a checkpoint (from `shared_checkpoint`) back into a running session:
    weights, optimizer state, RNG, data position and fp16's loss scale, on every rank."""
    store.load_weights(session.raw_model, ckpt.model)
    load_state(session.optimizer, rank_state(ckpt.url, ckpt.entries, session.optimizer, session.env))
    restore_rng(ckpt.rng, session.env.device)
    session.loader.load_state_dict(ckpt.state["loader"])
    if session.ctx.scaler is not None and ckpt.state.get("loss_scaler"):
        session.ctx.scaler.load_state_dict(ckpt.state["loss_scaler"])


def tell(loop, event: dict) -> None:
    """A spike event in the log, MLflow (at its step) and the attempt record (rank 0)."""
    log.warning("loss spike at step %s: loss %.4g (z %.1f), grad norm %.4g (z %.1f): %s", event["step"],
                *(float(event[k]) for k in ("loss", "loss_z", "grad_norm", "grad_norm_z")), {
                    "warned": "training on (train.on_spike=warn)", "skipped": "update dropped",
                    "rollback": f"rolled back to step {event.get('to_step')}"}[event["action"]])
    if not loop.s.env.is_main:
        return
    metrics = {f"spikes/{event['action']}": float(event.get("to_step", 1))}
    metrics.update({f"spikes/{k}": event[k] for k in ("loss_z", "grad_norm_z") if isinstance(event[k], float)})
    loop.tracker.log_metrics(metrics, step=event["step"])
    if loop.attempt is not None:
        loop.attempt.spike(event)


def roll_back(loop, verdict: Verdict, done: int) -> int:
    """Back to the newest checkpoint before step `done`, the data past every
    batch trained since (gpt2.train.rollback); returns that checkpoint's step.
    Past train.max_rollbacks the run fails instead."""
    limit = loop.cfg.train.max_rollbacks
    if loop.spikes.rollbacks() >= limit:
        raise loop.failures.agree(TrainingError(rollback.too_many(verdict.describe(), loop.spikes.events, limit)))
    loop._last_checkpoint()  # the save in flight may be the one to go back to
    ckpt, error, record = None, None, None
    if loop.s.env.is_main:
        try:
            ckpt, record = _record_rollback(loop, verdict, done)
        except Exception as err:  # noqa: BLE001 - every rank must hear of it (shared_checkpoint)
            error = err
    ckpt = shared_checkpoint(ckpt, error, loop.s.env)
    restore(loop.s, ckpt)
    state = ckpt.state
    loop.history = state.get("history", {"train": [], "val": []})
    loop.train_loss, loop.val_loss = state.get("train_loss"), state.get("val_loss")
    loop.spikes, loop.saved_step = Spikes.of_run(loop.cfg.train, state), ckpt.step
    if record is not None:
        tell(loop, rollback.rollback_event(record))
    return ckpt.step


def _record_rollback(loop, verdict: Verdict, done: int) -> tuple[store.Checkpoint, dict]:
    """Rank 0: read the checkpoint to go back to, and write the rollback's
    record beside it before anything else (fenced by the lease)."""
    url = rollback.newest_before(catalog.complete_checkpoints(loop.run_dir), done)
    if url is None:
        raise TrainingError(f"loss spike at {verdict.describe()}: no checkpoint before it to roll back to")
    ckpt = store.load_checkpoint(url, optimizer=False)
    if loop.attempt is not None:  # billed first: a kill from here on has thrown those steps away
        loop.attempt.rolled_back(done - ckpt.step, ckpt.step)
    number = loop.spikes.rollbacks() + 1
    record = {"rollback": number, "at_step": done, "to_step": ckpt.step,
              "data_from": rollback.folded(ckpt.state, rollback.read_records(url))["loader"],
              "data_to": loop.s.loader.state_dict(), "verdict": verdict.to_dict()}
    if loop.s.lease is not None:
        loop.s.lease.check()
    storage.write_record(rollback.record_url(url, number), record)
    return ckpt, record
