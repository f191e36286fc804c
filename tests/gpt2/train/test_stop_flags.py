"""The stop and lease flags ride on the step's loss all-reduce: a flag set on
one rank comes back set on every rank after the same step, and carrying them
changes neither the loss nor the weights."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt2.model import GPT
from gpt2.process.distributed import DistEnv
from gpt2.train.optim import make_optimizer
from gpt2.train.step import StepContext, train_step, train_step_with_flags
from tests.gpt2.train.fixtures import tiny_config
from tests.tiers import scenario

# Ranks spawned from the warm interpreter (tests/warm_python): gloo and the code under test unchanged.
pytestmark = pytest.mark.usefixtures("warm_spawn")

CPU = torch.device("cpu")


def _worker(rank: int, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    try:
        config = tiny_config(tmp)
        torch.manual_seed(0)
        plain = GPT(config.model)
        carrying = copy.deepcopy(plain)
        opt_plain = make_optimizer(plain, config.train, "cpu")
        opt_carrying = make_optimizer(carrying, config.train, "cpu")
        ctx = StepContext(DistEnv(rank, rank, 2, CPU), None, 1.0)
        gen = torch.Generator().manual_seed(rank)  # each rank its own tokens
        results = []
        for step in range(3):
            x = torch.randint(0, 50257, (4, 33), generator=gen)
            batches = [(x[:2, :-1], x[:2, 1:]), (x[2:, :-1], x[2:, 1:])]
            loss, norm = train_step(plain, plain, opt_plain, batches, ctx)
            # Rank 1 alone is told to stop at step 1; the lease flag stays down.
            flags = [rank == 1 and step == 1, False]
            loss2, norm2, agreed = train_step_with_flags(carrying, carrying, opt_carrying, batches, ctx,
                                                         lambda: flags)
            results.append({"loss": [loss, loss2], "norm": [norm, norm2], "agreed": agreed})
        same = all(torch.equal(a, b) for a, b in zip(plain.parameters(), carrying.parameters()))
        with open(f"{tmp}/rank{rank}.json", "w") as f:
            json.dump({"steps": results, "same_weights": same}, f)
    finally:
        dist.destroy_process_group()


@scenario
def test_a_flag_on_one_rank_is_agreed_by_all_after_the_same_step(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert [s["agreed"] for s in r["steps"]] == [[False, False], [True, False], [False, False]]
        for s in r["steps"]:
            assert s["loss"][0] == s["loss"][1] and s["norm"][0] == s["norm"][1]
        assert r["same_weights"]
    # The loss is the mean over ranks: every rank reports the same number.
    assert [s["loss"] for s in ranks[0]["steps"]] == [s["loss"] for s in ranks[1]["steps"]]


def test_one_process_gets_its_own_flags_back():
    config = tiny_config("memory://unused")
    torch.manual_seed(0)
    model = GPT(config.model)
    opt = make_optimizer(model, config.train, "cpu")
    x = torch.randint(0, 50257, (2, 33), generator=torch.Generator().manual_seed(0))
    ctx = StepContext(DistEnv(0, 0, 1, CPU), None, 1.0)
    _, _, agreed = train_step_with_flags(model, model, opt, [(x[:, :-1], x[:, 1:])], ctx, lambda: [True, False])
    assert agreed == [True, False]
