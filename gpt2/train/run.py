"""One training run in this process: join the process group, open the
session (data, model, resumed state), run the loop, and turn SIGTERM into a
checkpoint and `Preempted`. The command line is `python -m gpt2.train`
(gpt2/train/__main__.py).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from gpt2.config import Config
from gpt2.train.distributed import distributed
from gpt2.train.loop import Loop
from gpt2.train.preemption import SigtermGuard
from gpt2.train.progress import Progress
from gpt2.train.session import TrainingError, open_session, take_lease

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what schedulers expect from a stopped job


class Preempted(TrainingError):
    """SIGTERM arrived; a checkpoint was written and the run can be resumed."""


@dataclass(frozen=True)
class TrainResult:
    run_name: str
    checkpoint: str | None
    steps: int
    resumed_from_step: int
    final_train_loss: float | None
    final_val_loss: float | None
    tokens_per_second: float
    mlflow_run_id: str | None
    micro_batch_size: int
    world_size: int

    def to_dict(self) -> dict:
        return asdict(self)


def train(config: Config, fresh: bool = False, progress: Progress | None = None,
          parent_run_id: str | None = None, tags: dict | None = None) -> TrainResult:
    """Train `config` to `train.max_steps`, resuming from its newest checkpoint
    (unless `fresh`). Raises TrainingError (NaN loss, OOM, bad batch shape);
    after SIGTERM, whatever the replaced SIGTERM handler raises, else
    Preempted (gpt2.train.preemption). The last good checkpoint is always kept."""
    guard = SigtermGuard()
    with distributed(config.runtime.device) as env, guard.installed():
        lease = take_lease(config, env, (tags or {}).get("prefect.flow_run_id"))
        try:
            session = open_session(config, env, fresh, lease)
            outcome = Loop(session, progress, parent_run_id, tags, stop=guard).run()
        finally:
            if lease is not None:
                lease.release()
        if outcome.preempted:
            guard.hand_on()  # the checkpoint is written: an orchestrator's own handling may run now
            raise Preempted(f"stopped by SIGTERM after step {outcome.steps}; checkpoint {outcome.checkpoint}; "
                            "rerun the same command to resume")
        return TrainResult(
            run_name=outcome.run_name, checkpoint=outcome.checkpoint, steps=outcome.steps,
            resumed_from_step=session.start_step, final_train_loss=outcome.train_loss,
            final_val_loss=outcome.val_loss, tokens_per_second=outcome.tokens_per_second,
            mlflow_run_id=outcome.mlflow_run_id, micro_batch_size=session.micro_batch,
            world_size=env.world_size,
        )
