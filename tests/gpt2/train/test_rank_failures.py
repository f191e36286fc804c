"""A failure one rank lives through stops every rank at the next step's flag
all-reduce, each ending with the failing rank's message (never a collective
timeout); a stop agreed at a step goes straight to its checkpoint.

The two-rank runs are real `train()` calls on two gloo processes, started in a
subprocess bounded by a timeout, so a hang fails the test instead of blocking it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import torch.multiprocessing as mp

from gpt2 import storage
from gpt2.checkpoint import store
from gpt2.train.run import train
from tests.gpt2.train.fixtures import tiny_config, write_dataset

REPO = Path(__file__).resolve().parents[3]
FAIL_AT = 3  # the step whose report fails on rank 0 (checkpoints at 2, 4, ...)


STOP = {"train.eval_every": 4, "train.sample_every": 4}  # due at step 4, as is a checkpoint


class ReportFailed(RuntimeError):
    pass


def _worker(rank: int, tmp: str, port: int, case: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def progress(info) -> None:  # rank 0's reporting (only rank 0 reports)
        if info.step == FAIL_AT and case == "fail":
            raise ReportFailed(f"the status disk is full at step {info.step}")
        if info.step == 3 and case == "stop":  # after step 3's flags: agreed at step 4's
            os.kill(os.getpid(), signal.SIGTERM)

    outcome = {"rank": rank}
    try:
        result = train(tiny_config(Path(tmp), **(STOP if case == "stop" else {})), progress=progress)
        outcome["result"] = result.to_dict()
    except Exception as err:  # noqa: BLE001 - what each rank ended with is the point
        outcome["error"] = f"{type(err).__name__}: {err}"
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(outcome))


def main(tmp: str, case: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(tmp, port, case), nprocs=2)


def _two_ranks(tmp: Path, case: str) -> list[dict]:
    """Both ranks' outcomes; a hang fails here (subprocess timeout)."""
    code = f"from tests.gpt2.train.test_rank_failures import main; main({str(tmp)!r}, {case!r})"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                   check=True, timeout=240)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_failure_in_rank_0_reporting_stops_both_ranks_with_its_message(tmp_path):
    write_dataset(tiny_config(tmp_path))
    ranks = _two_ranks(tmp_path, "fail")
    assert "result" not in ranks[0] and "result" not in ranks[1]
    assert ranks[0]["error"] == f"ReportFailed: the status disk is full at step {FAIL_AT}"
    # Rank 1 never saw the exception: the flag all-reduce of the next step told it, and what.
    assert ranks[1]["error"] == (f"TrainingError: rank 0 failed: ReportFailed: the status disk is full at step "
                                 f"{FAIL_AT}; every rank stopped after step {FAIL_AT + 1}")
    # The step the failure was agreed at is never checkpointed; the one before stays the newest.
    complete = [Path(u).name for u in store.complete_checkpoints(tiny_config(tmp_path))]
    assert max(complete) == f"step_{FAIL_AT - 1:06d}"


def test_a_stop_agreed_at_a_step_skips_its_validation_and_goes_to_the_checkpoint(tmp_path):
    config = tiny_config(tmp_path, **STOP)
    write_dataset(config)
    ranks = _two_ranks(tmp_path, "stop")
    assert all(r["error"].startswith("Preempted: stopped by SIGTERM after step 4") for r in ranks)
    newest = max(store.complete_checkpoints(config), key=lambda url: Path(url).name)
    assert newest.endswith("step_000004")
    state = storage.read_record(storage.join(newest, "state.json"))
    assert [s for s, _ in state["history"]["train"]] == [1, 2, 3, 4]
    assert state["history"]["val"] == []  # step 4's validation never ran
