"""ZeRO-1 (runtime.shard_optimizer) on two real gloo processes under torchrun:
the same weights as plain AdamW, checkpoints that resume across the setting,
and `auto` turning it on where the plain step does not fit the memory limit."""

from __future__ import annotations

import shutil

import pytest
import torch
from mlflow import MlflowClient

from gpt2.checkpoint import store
from gpt2.root import storage
from gpt2.tracking.store import default_tracking_uri
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.test_train import weights
from tests.gpt2.train.test_train_process import run_to_end
from tests.tiers import SCENARIO

pytestmark = SCENARIO


def _optimizer_state(checkpoint: str) -> dict:
    """The whole AdamW state: each rank stored its own share, in its own file."""
    names = sorted(store.read_marker(checkpoint)["files"])
    assert [n for n in names if n.startswith("optimizer")] == ["optimizer-00000-of-00002.pt",
                                                                 "optimizer-00001-of-00002.pt"]
    parts = [torch.load(storage.local_path(storage.join(checkpoint, f"optimizer-0000{r}-of-00002.pt")),
                        weights_only=True) for r in range(2)]
    assert parts[0]["state"] and parts[1]["state"] and not parts[0]["state"].keys() & parts[1]["state"].keys()
    whole = store.load_checkpoint(checkpoint).optimizer
    assert whole["state"].keys() == parts[0]["state"].keys() | parts[1]["state"].keys()
    return whole


def _assert_same_run(a: dict, b: dict) -> None:
    """Bit for bit: ZeRO-1 runs the same AdamW kernels on the same gradients,
    only split over the ranks, and broadcasts the updated weights unchanged."""
    assert a["final_val_loss"] == b["final_val_loss"] and a["final_train_loss"] == b["final_train_loss"]
    wa, wb = weights(a["checkpoint"]), weights(b["checkpoint"])
    assert all(torch.equal(wa[k], wb[k]) for k in wb)
    sa, sb = _optimizer_state(a["checkpoint"]), _optimizer_state(b["checkpoint"])
    assert sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys()
    for i, state in sb["state"].items():
        assert all(torch.equal(sa["state"][i][k], v) for k, v in state.items())


def _keep_only(config, step: int) -> None:
    for url in store.complete_checkpoints(config):
        if not url.endswith(f"step_{step:06d}"):
            shutil.rmtree(storage.local_path(url))


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plain")
    config = tiny_config(tmp, **{"runtime.shard_optimizer": False})
    write_dataset(config)
    return config, tmp, run_to_end(config, tmp, torchrun=2)


def test_zero1_on_two_processes_equals_plain_adamw_and_checkpoints_resume_across_it(plain_run, tmp_path):
    plain_config, plain_tmp, plain = plain_run
    config = tiny_config(tmp_path, **{"runtime.shard_optimizer": True})
    write_dataset(config)
    sharded = run_to_end(config, tmp_path, torchrun=2)
    assert sharded["shard_optimizer"] is True and plain["shard_optimizer"] is False
    assert sharded["world_size"] == 2 and sharded["steps"] == 8
    # The checkpoint holds the full AdamW state either way (one share per rank).
    _assert_same_run(sharded, plain)

    # Written with ZeRO-1, resumed without it (same identity: runtime only).
    _keep_only(config, 4)
    unsharded = run_to_end(tiny_config(tmp_path, **{"runtime.shard_optimizer": False}), tmp_path, torchrun=2)
    assert unsharded["resumed_from_step"] == 4 and unsharded["shard_optimizer"] is False
    _assert_same_run(unsharded, plain)

    # Written without it, resumed with it (and with recomputation under DDP,
    # which changes no number either).
    _keep_only(plain_config, 4)
    resharded = run_to_end(tiny_config(plain_tmp, **{"runtime.shard_optimizer": True, "runtime.recompute": True}),
                           plain_tmp, torchrun=2)
    assert resharded["resumed_from_step"] == 4 and resharded["shard_optimizer"] is True
    assert resharded["recompute"] is True
    _assert_same_run(resharded, plain)


# Deep and narrow (see test_memory_savers): 8 sequences of 64 tokens per rank.
DEEP = {"model.n_layer": 16, "model.n_embd": 128, "model.block_size": 64, "train.total_batch_tokens": 1024,
        "train.micro_batch_size": "auto", "train.max_steps": 1, "train.val_steps": 1, "train.eval_every": 1,
        "train.checkpoint_every": 1, "runtime.recompute": False}


@pytest.mark.parametrize("shard, micro", [("auto", 8), (False, 4)])
def test_auto_shards_the_optimizer_where_the_plain_step_does_not_fit(tmp_path, shard, micro):
    # Rank 0 keeps AdamW's state for the token embedding (its largest share):
    # the plain step needs ~310 MiB here, with ZeRO-1 ~290, at 4 sequences ~230.
    config = tiny_config(tmp_path, **DEEP, **{"runtime.shard_optimizer": shard, "runtime.memory_limit_mb": 300})
    write_dataset(config, val_tokens=2048)
    result = run_to_end(config, tmp_path, torchrun=2)
    assert result["micro_batch_size"] == micro and result["shard_optimizer"] is (shard == "auto")
    assert result["recompute"] is False
    # MLflow has the configured setting and what it resolved to.
    params = MlflowClient(default_tracking_uri(config)).get_run(result["mlflow_run_id"]).data.params
    assert params["runtime.shard_optimizer"] == str(shard)
    assert params["resolved.runtime.shard_optimizer"] == str(shard == "auto")
