"""A failure inside a step's collectives on one rank (an OOM in its forward,
an error in its validation pass) reaches the other ranks at once through the
failure board: they stop with the failing rank's message instead of waiting
for it in DDP's gradient all-reduce or validation's all-reduce until
runtime.collective_timeout_s, or failing with gloo's "Connection closed by
peer", which names nothing of the cause.

The two-rank runs are real `train()` calls on two gloo processes, started in a
subprocess bounded by a timeout; the collective timeout is set far beyond
that bound, so waiting it out fails the test as a hang."""

from __future__ import annotations

from pathlib import Path

import torch

from gpt2.checkpoint import store
from gpt2.model import GPT
from gpt2.train.run import train
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.two_ranks import join_as, record_outcome, run_pair, spawn
from tests.tiers import SCENARIO

pytestmark = SCENARIO

RUN_TIMEOUT_S = 240  # the subprocess's bound; the collective timeout is far beyond it
SETTINGS = {"runtime.collective_timeout_s": 50 * RUN_TIMEOUT_S}
FAIL_AT = 3  # the step whose forward fails (one micro-batch per rank per step; checkpoints at 2, 4, ...)
OOM = f"CUDA out of memory (injected in the forward of step {FAIL_AT})"
VAL_ERROR = "the validation batch is broken (injected)"
CASES = {"forward": 1, "validation": 0}  # case -> the rank it fails on (rank 0 also serves the store)


class InjectedError(RuntimeError):
    pass


def _inject(case: str) -> None:
    """Make this process's model fail where `case` says, inside the step."""
    real, calls = GPT.forward, []

    def forward(self, idx, targets=None, return_logits=True):
        if case == "forward" and self.training:
            calls.append(1)
            if len(calls) == FAIL_AT:
                raise torch.OutOfMemoryError(OOM)
        if case == "validation" and not self.training and targets is not None:
            raise InjectedError(VAL_ERROR)
        return real(self, idx, targets, return_logits)

    GPT.forward = forward


def _worker(rank: int, tmp: str, case: str, port: int) -> None:
    join_as(rank, port)
    if rank == CASES[case]:
        _inject(case)
    record_outcome(tmp, rank, lambda: train(tiny_config(Path(tmp), **SETTINGS)))


def main(tmp: str, case: str) -> None:
    spawn(_worker, tmp, case)


def _two_ranks(tmp: Path, case: str) -> list[dict]:
    """Both ranks' outcomes; a hang fails here."""
    write_dataset(tiny_config(tmp, **SETTINGS))
    return run_pair(f"from tests.gpt2.train.test_step_failures import main; main({str(tmp)!r}, {case!r})", tmp,
                    timeout=RUN_TIMEOUT_S)


def _newest_checkpoint(tmp: Path) -> str:
    return max(Path(u).name for u in store.complete_checkpoints(tiny_config(tmp, **SETTINGS)))


def test_an_oom_in_one_ranks_forward_stops_the_other_with_its_message(tmp_path):
    ranks = _two_ranks(tmp_path, "forward")
    assert "result" not in ranks[0] and "result" not in ranks[1]
    own = ranks[1]["error"]
    assert own.startswith(f"TrainingError: out of memory at step {FAIL_AT} with micro-batch") and OOM in own
    # Rank 0 was waiting in DDP's gradient all-reduce: the board told it who failed, and why.
    assert ranks[0]["error"].startswith(f"TrainingError: rank 1 failed: {own}; rank 0 stopped after step ")
    assert _newest_checkpoint(tmp_path) == f"step_{FAIL_AT - 1:06d}"


def test_an_error_in_one_ranks_validation_stops_the_other_with_its_message(tmp_path):
    config = tiny_config(tmp_path, **SETTINGS)
    ranks = _two_ranks(tmp_path, "validation")
    assert "result" not in ranks[0] and "result" not in ranks[1]
    assert ranks[0]["error"] == f"InjectedError: {VAL_ERROR}"
    # Rank 1 was waiting in validation's all-reduce; rank 0, which serves the
    # store here, waited for it to read the message before tearing down.
    assert ranks[1]["error"].startswith(f"TrainingError: rank 0 failed: InjectedError: {VAL_ERROR}; rank 1 stopped "
                                        f"after step {config.train.eval_every} ")
    # Validation runs before the step's checkpoint: the failed step is never saved.
    assert _newest_checkpoint(tmp_path) == f"step_{config.train.eval_every - config.train.checkpoint_every:06d}"
