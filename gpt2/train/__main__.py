"""The training stage's command line: train GPT-2 on the data stage's shards, resumably.

    python -m gpt2.train --config run.json                    # one device
    torchrun --standalone --nproc_per_node=8 -m gpt2.train --config run.json
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=node0:29500 \
        --rdzv-id=RUN -m gpt2.train --config run.json           # on each of 2 machines
    python -m gpt2.train --config run.json --fresh            # start over

`run.json` is a full config (`gpt2 config show ... > run.json`). Rerunning the
same config resumes from the newest complete checkpoint. Exit codes: 0 done,
1 failed, 143 stopped by SIGTERM after writing a checkpoint (rerun to resume).
With --result PATH rank 0 also writes the result as JSON there; with
--status PATH it appends progress and the outcome as JSON lines
(gpt2.train.status_file.StatusFile), which is how a parent process follows it.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
from pathlib import Path

from gpt2.process import collector

if __name__ == "__main__":  # a trainer's process, not an import of main(): gpt2.process.collector says why
    collector.pause()  # until the run has its model and data (gpt2.train.run)

from gpt2.config.tree import Config
from gpt2.data.epoch import with_resolved_steps
from gpt2.errors import UserError
from gpt2.process.console import survive_closed_console
from gpt2.train.progress import ProgressBar, StepInfo
from gpt2.train.run import PREEMPTED_EXIT_CODE, Preempted, train
from gpt2.train.status_file import StatusFile

collector.freeze_imports()

log = logging.getLogger("gpt2.train")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpt2.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="full config JSON (gpt2 config show > run.json)")
    parser.add_argument("--fresh", action="store_true", help="delete this run's checkpoints and start over")
    parser.add_argument("--result", type=Path, help="rank 0 writes the result JSON here")
    parser.add_argument("--status", type=Path, help="rank 0 appends progress and the outcome here (JSON lines)")
    parser.add_argument("--parent-run-id", help="MLflow run to nest this run under")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="MLflow tag (repeatable)")
    return parser.parse_args(argv)


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def _reporter(rank: int, max_steps: int, status: StatusFile | None):
    """Rank 0's progress: the terminal bar, and the status file when asked for."""
    if rank != 0:
        return None, None
    bar = ProgressBar(max_steps)

    def report(info: StepInfo) -> None:
        bar(info)
        if status is not None:
            status.step(info)

    return bar, report


def main(argv: list[str] | None = None) -> int:
    survive_closed_console()  # `torchrun ... | tee`: a Ctrl-C that ends tee must not end the checkpoint
    args = _parse(argv)
    rank = _rank()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s")
    config = Config.model_validate(json.loads(args.config.read_text()))
    # Every machine's launcher needs the outcome: local rank 0 writes it where global rank 0 is elsewhere.
    status = StatusFile(args.status) if args.status and (rank == 0 or _local_rank() == 0) else None
    outcome = status.write if status is not None else lambda *a, **k: None
    try:
        config = with_resolved_steps(config)  # `epoch` as a number, the progress bar's total too
    except UserError as err:
        log.error("%s", err)
        outcome("error", message=str(err))
        return 1
    bar, report = _reporter(rank, config.train.max_steps, status)
    try:
        tags = dict(t.split("=", 1) for t in args.tag)
        result = train(config, fresh=args.fresh, progress=report, parent_run_id=args.parent_run_id, tags=tags)
    except Preempted as err:
        log.warning("%s", err)
        outcome("preempted", message=str(err))
        return PREEMPTED_EXIT_CODE
    except (UserError, FileNotFoundError) as err:  # TrainingError, damaged checkpoints, bad data
        log.error("%s", err)
        outcome("error", message=str(err))
        return 1
    except BaseException as err:
        outcome("error", message=f"{type(err).__name__}: {err}")
        raise
    finally:
        if bar is not None:
            bar.close()
    outcome("done", result=result.to_dict())  # every machine's launcher reads its own
    if rank == 0:
        text = json.dumps(result.to_dict())
        if args.result:
            args.result.write_text(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    code = main()
    gc.freeze()  # what the trainer imported goes with the process: no final collection over it (seconds)
    sys.exit(code)
