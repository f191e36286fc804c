"""One node of a multi-node training Job on Kubernetes (the pods of
deployments/multinode/training-job.yaml run this):

    python -m gpt2.launch.node --config run.json --launch launch.json --job NAME

It runs this machine's part of the run through the same launcher as one
machine (torchrun with the config's c10d rendezvous, SIGTERM handed on to
the trainer, which checkpoints), then records this node's outcome under the
artifact root, where the training flow reads it: `{"event": "done", "result":
...}`, `{"event": "preempted", "message": ...}` or `{"event": "error",
"message": ...}`. Pod 0 (JOB_COMPLETION_INDEX 0) serves the rendezvous.
Exit codes as `python -m gpt2.train`: 0 done, 1 failed, 143 stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.launch.torchrun import torchrun_train
from gpt2.root import layout, storage
from gpt2.train.run import PREEMPTED_EXIT_CODE, Preempted

log = logging.getLogger("gpt2.launch.node")


def run_node(config: Config, job: str, index: int, parent_run_id: str | None = None,
             tags: dict | None = None) -> tuple[int, dict]:
    """Train this node's part; record and return (exit code, outcome)."""
    try:
        result = torchrun_train(config, log_line=print, parent_run_id=parent_run_id, tags=tags,
                                rendezvous_host=index == 0)
        code, outcome = 0, {"event": "done", "result": result.to_dict()}
    except Preempted as err:
        code, outcome = PREEMPTED_EXIT_CODE, {"event": "preempted", "message": str(err)}
    except (UserError, FileNotFoundError) as err:  # TrainingError, a worker that died
        code, outcome = 1, {"event": "error", "message": str(err)}
    storage.write_record(layout.node_outcome(config, job, index), {"node": index, **outcome})
    log.info("node %d: %s (exit %d)", index, outcome["event"], code)
    return code, outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpt2.launch.node", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="full config JSON, rendezvous included")
    parser.add_argument("--launch", type=Path, help='JSON {"parent_run_id": ..., "tags": {...}} for MLflow')
    parser.add_argument("--job", required=True, help="the Job's name: where this node records its outcome")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = Config.model_validate(json.loads(args.config.read_text()))
    launch = json.loads(args.launch.read_text()) if args.launch else {}
    index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    code, _ = run_node(config, args.job, index, launch.get("parent_run_id"), launch.get("tags"))
    return code


if __name__ == "__main__":
    sys.exit(main())
