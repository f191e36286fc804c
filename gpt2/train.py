"""The training stage: train GPT-2 on the data stage's shards, resumably.

    python -m gpt2.train --config run.json                    # one device
    torchrun --standalone --nproc_per_node=8 -m gpt2.train --config run.json
    python -m gpt2.train --config run.json --fresh            # start over

`run.json` is a full config (`gpt2 config show ... > run.json`). Rerunning the
same config resumes from the newest complete checkpoint. Exit codes: 0 done,
1 failed, 143 stopped by SIGTERM after writing a checkpoint (rerun to resume).
With --result PATH rank 0 also writes the result as JSON there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from gpt2.config import Config
from gpt2.distributed import distributed
from gpt2.loop import Loop
from gpt2.progress import Progress, ProgressBar
from gpt2.session import TrainingError, open_session

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


class StopFlag:
    """Set by SIGTERM; the loop finishes its step, checkpoints and stops."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum, frame) -> None:
        log.warning("SIGTERM received: finishing this step, then writing a checkpoint")
        self.requested = True


@contextlib.contextmanager
def sigterm_handler(flag: StopFlag) -> Iterator[None]:
    # Signal handlers can only be installed from the main thread; elsewhere
    # (a worker thread of an orchestrator) the default handling stays.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, flag)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def train(config: Config, fresh: bool = False, progress: Progress | None = None,
          parent_run_id: str | None = None, tags: dict | None = None) -> TrainResult:
    """Train `config` to `train.max_steps`, resuming from its newest checkpoint
    (unless `fresh`). Raises TrainingError (NaN loss, OOM, bad batch shape) or
    Preempted after SIGTERM; the last good checkpoint is always kept."""
    flag = StopFlag()
    with distributed(config.runtime.device) as env, sigterm_handler(flag):
        session = open_session(config, env, fresh)
        loop = Loop(session, progress, parent_run_id, tags, stop=flag)
        outcome = loop.run()
        if outcome.preempted:
            raise Preempted(f"stopped by SIGTERM after step {outcome.steps}; checkpoint {outcome.checkpoint}; "
                            "rerun the same command to resume")
        return TrainResult(
            run_name=outcome.run_name, checkpoint=outcome.checkpoint, steps=outcome.steps,
            resumed_from_step=session.start_step, final_train_loss=outcome.train_loss,
            final_val_loss=outcome.val_loss, tokens_per_second=outcome.tokens_per_second,
            mlflow_run_id=outcome.mlflow_run_id, micro_batch_size=session.micro_batch,
            world_size=env.world_size,
        )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpt2.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="full config JSON (gpt2 config show > run.json)")
    parser.add_argument("--fresh", action="store_true", help="delete this run's checkpoints and start over")
    parser.add_argument("--result", type=Path, help="rank 0 writes the result JSON here")
    parser.add_argument("--parent-run-id", help="MLflow run to nest this run under")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="MLflow tag (repeatable)")
    return parser.parse_args(argv)


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank = _rank()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s")
    config = Config.model_validate(json.loads(args.config.read_text()))
    bar = ProgressBar(config.train.max_steps) if rank == 0 else None
    try:
        tags = dict(t.split("=", 1) for t in args.tag)
        result = train(config, fresh=args.fresh, progress=bar, parent_run_id=args.parent_run_id, tags=tags)
    except Preempted as err:
        log.warning("%s", err)
        return PREEMPTED_EXIT_CODE
    except (TrainingError, FileNotFoundError) as err:
        log.error("%s", err)
        return 1
    finally:
        if bar is not None:
            bar.close()
    if rank == 0:
        text = json.dumps(result.to_dict())
        if args.result:
            args.result.write_text(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
