"""A failure one rank lives through stops every rank at the next step's flag
all-reduce, each ending with the failing rank's message (never a collective
timeout); a stop agreed at a step goes straight to its checkpoint.

The two-rank runs are real `train()` calls on two gloo processes, started in a
subprocess bounded by a timeout, so a hang fails the test instead of blocking it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpt2.checkpoint import store
from gpt2.root import storage
from gpt2.train.run import train
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.two_ranks import join_as, record_outcome, run_pair, spawn
from tests.tiers import SCENARIO

pytestmark = SCENARIO

FAIL_AT = 3  # the step whose report fails on rank 0 (checkpoints at 2, 4, ...)


STOP = {"train.eval_every": 4, "train.sample_every": 4}  # due at step 4, as is a checkpoint


class ReportFailed(RuntimeError):
    pass


def _worker(rank: int, tmp: str, case: str, port: int) -> None:
    join_as(rank, port)

    def progress(info) -> None:  # rank 0's reporting (only rank 0 reports)
        if info.step == FAIL_AT and case == "fail":
            raise ReportFailed(f"the status disk is full at step {info.step}")
        if info.step == 3 and case == "stop":  # after step 3's flags: agreed at step 4's
            os.kill(os.getpid(), signal.SIGTERM)

    record_outcome(tmp, rank, lambda: train(tiny_config(Path(tmp), **(STOP if case == "stop" else {})),
                                            progress=progress))


def main(tmp: str, case: str) -> None:
    spawn(_worker, tmp, case)


def _two_ranks(tmp: Path, case: str) -> list[dict]:
    """Both ranks' outcomes; a hang fails here."""
    return run_pair(f"from tests.gpt2.train.test_rank_failures import main; main({str(tmp)!r}, {case!r})", tmp,
                    timeout=240)


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
