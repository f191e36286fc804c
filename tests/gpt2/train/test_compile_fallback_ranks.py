"""runtime.compile=auto under DDP (gpt2.train.compile_choice): when the first
compiled step fails on the ranks, every rank goes on with the eager model in a
DDP of its own, and the run trains what a two-rank eager run trains, without a
hang (the failed DDP's gradient hooks are gone before the first real step).

As in tests/gpt2/train/test_compile_choice.py, the decision is the one a CUDA
card that compiles makes, and the failure is torch's own (a backend that raises)."""

from __future__ import annotations

from pathlib import Path

import torch

from gpt2.train import compile_choice
from gpt2.train.compile_choice import CompileChoice
from gpt2.train.run import train
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.two_ranks import join_as, record_outcome, run_pair, spawn
from tests.tiers import SCENARIO

pytestmark = SCENARIO

RUN_TIMEOUT_S = 240
SETTINGS = {"runtime.collective_timeout_s": 50 * RUN_TIMEOUT_S, "train.max_steps": 4, "tracking.enabled": False,
            "train.total_batch_tokens": 512}


def _failing_compile() -> None:
    """This process compiles as on a card that compiles, and its compiler refuses."""
    real_compile = torch.compile

    def refuse(graph, example_inputs):
        raise RuntimeError("no kernels for this device")

    torch.compile = lambda model, **kw: real_compile(model, backend=refuse, **kw)
    compile_choice.choose_compile = lambda setting, caps: CompileChoice(True, "auto: compiles")


def _worker(rank: int, tmp: str, compile: str, port: int) -> None:
    join_as(rank, port)
    if compile == "auto":
        _failing_compile()
    setting = "auto" if compile == "auto" else False
    record_outcome(tmp, rank, lambda: train(tiny_config(Path(tmp), **SETTINGS, **{"runtime.compile": setting})))


def main(tmp: str, compile: str) -> None:
    spawn(_worker, tmp, compile)


def _two_ranks(tmp: Path, compile: str) -> list[dict]:
    write_dataset(tiny_config(tmp, **SETTINGS))
    return run_pair(f"from tests.gpt2.train.test_compile_fallback_ranks import main; main({str(tmp)!r}, "
                    f"{compile!r})", tmp, timeout=RUN_TIMEOUT_S)


def test_every_rank_falls_back_and_the_run_trains_what_an_eager_run_trains(tmp_path):
    fell_back = _two_ranks(tmp_path / "auto", "auto")
    eager = _two_ranks(tmp_path / "eager", "false")
    for ranks in (fell_back, eager):
        assert all("result" in r for r in ranks), ranks
    assert [r["result"]["compile_cache"] for r in fell_back] == ["failed", "failed"]
    assert [r["result"]["compile_cache"] for r in eager] == [None, None]
    for mine, theirs in zip(fell_back, eager):
        assert (mine["result"]["final_train_loss"], mine["result"]["final_val_loss"]) == \
            (theirs["result"]["final_train_loss"], theirs["result"]["final_val_loss"])
