"""train.optimizer=muon: Muon for the blocks' matrices, AdamW for the rest,
with everything AdamW has: its groups by name, an identity of its own (and
AdamW's runs keep their addresses), the state a checkpoint saves, bit-exact
resume after SIGTERM and SIGKILL, ZeRO-1 shares on two gloo ranks, the memory the probe
and `gpt2 plan` count, and the export that transformers loads."""

from __future__ import annotations

import math
import signal

import pytest
import torch

from gpt2.checkpoint import store
from gpt2.config.identity import train_fingerprint
from gpt2.config.overrides import ConfigError
from gpt2.errors import UserError
from gpt2.export.hf import write_hf_dir
from gpt2.model import GPT
from gpt2.root import layout, storage
from gpt2.train import memory
from gpt2.train.optim import load_state, make_optimizer, set_lr, state_bytes
from gpt2.train.run import PREEMPTED_EXIT_CODE
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.gpt2.train.test_train import weights
from tests.gpt2.train.test_train_process import finish, launch, run_to_end, sigkill, wait_for
from tests.gpt2.train.test_zero import _assert_same_run, _keep_only, _optimizer_state
from tests.tiers import scenario

MUON = {"train.optimizer": "muon"}



def _model_and_optimizer(**overrides):
    config = tiny_config("memory://unused", **overrides)
    torch.manual_seed(0)
    model = GPT(config.model)
    return config, model, make_optimizer(model, config.train, "cpu")


def test_muon_steps_the_blocks_matrices_and_adamw_the_rest_by_name():
    _, model, opt = _model_and_optimizer(**MUON, **{"train.muon_lr": 6e-3})
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [(g["algorithm"], g["weight_decay"], g["lr_ratio"], sorted(names[id(p)] for p in g["params"]))
              for g in opt.param_groups]
    matrices = sorted(f"transformer.h.{i}.{k}" for i in range(2)
                      for k in ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"))
    no_decay = sorted(n for n, p in model.named_parameters() if p.dim() < 2)
    assert groups == [("adamw", 0.1, 1.0, ["transformer.wpe.weight", "transformer.wte.weight"]),  # wte is the head
                      ("adamw", 0.0, 1.0, no_decay),
                      ("muon", 0.1, 2.0, matrices)]
    assert opt.param_groups[2]["adjust_lr_fn"] == "match_rms_adamw" and opt.param_groups[2]["momentum"] == 0.95
    set_lr(opt, 1e-3)  # the schedule's lr; Muon's group at muon_lr / lr of it
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-3, 2e-3]


def test_each_group_moves_by_its_own_algorithm():
    """One step of MuonAdamW equals torch.optim.AdamW and torch.optim.Muon run
    apart on the same groups and gradients."""
    config, model, opt = _model_and_optimizer(**MUON)
    twin = GPT(config.model)
    twin.load_state_dict(model.state_dict())
    by_name = dict(twin.named_parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    apart = []
    for g in opt.param_groups:
        params = [by_name[names[id(p)]] for p in g["params"]]
        settings = {k: v for k, v in g.items() if k not in ("params", "algorithm", "lr_ratio")}
        algorithm = torch.optim.Muon if g["algorithm"] == "muon" else torch.optim.AdamW
        apart.append(algorithm([{"params": params, **settings}]))
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        for (n, p), q in zip(model.named_parameters(), twin.parameters()):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.step()
        for o in apart:
            o.step()
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), n


def test_the_optimizer_is_identity_and_adamw_runs_keep_their_address():
    adamw = tiny_config("memory://r")
    # Written before the optimizer keys existed: AdamW's runs keep this address.
    assert train_fingerprint(adamw) == train_fingerprint(tiny_config("memory://r", **{"train.muon_lr": 1.0}))
    muon = tiny_config("memory://r", **MUON)
    assert train_fingerprint(muon) != train_fingerprint(adamw)
    other_momentum = tiny_config("memory://r", **MUON, **{"train.muon_momentum": 0.9})
    assert train_fingerprint(other_momentum) != train_fingerprint(muon)


def test_an_unknown_optimizer_is_a_config_error_naming_the_allowed_values():
    with pytest.raises(ConfigError, match=r"train.optimizer: Input should be 'adamw' or 'muon' \(got 'sgd'\)"):
        tiny_config("memory://r", **{"train.optimizer": "sgd"})


def test_muon_on_a_torch_without_it_is_refused_before_anything_trains(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(UserError, match=r"train.optimizer=muon needs torch.optim.Muon \(torch >= 2.9\).*"
                                        r"set train.optimizer=adamw"):
        _model_and_optimizer(**MUON)


def test_another_optimizers_state_is_refused_before_loading():
    _, _, muon = _model_and_optimizer(**MUON)
    _, _, adamw = _model_and_optimizer()
    for opt in (muon, adamw):
        for p in (q for g in opt.param_groups for q in g["params"]):
            p.grad = torch.ones_like(p)
        opt.step()
    saved = adamw.state_dict()
    before = {i: {k: v.clone() for k, v in s.items()} for i, s in muon.state_dict()["state"].items()}
    with pytest.raises(UserError, match="optimizer state of train.optimizer=adamw.*set train.optimizer=adamw"):
        load_state(muon, saved)
    after = muon.state_dict()["state"]
    assert all(torch.equal(after[i][k], v) for i, s in before.items() for k, v in s.items())
    with pytest.raises(UserError, match="train.optimizer=muon"):
        load_state(adamw, muon.state_dict())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_state_bytes_are_the_state_the_optimizer_really_keeps(optimizer):
    """The memory emulation and the probe count what exists: two moments a
    parameter for AdamW, one buffer a matrix for Muon."""
    _, model, opt = _model_and_optimizer(**{"train.optimizer": optimizer})
    memory.settle(opt)
    kept = sum(t.nbytes for s in opt.state.values() for k, t in s.items() if k != "step")
    assert state_bytes(opt) == kept
    weights_bytes = sum(p.nbytes for p in model.parameters())
    assert memory.static_bytes(model, state_bytes=kept) == 2 * weights_bytes + kept


def test_the_plan_counts_one_buffer_per_matrix_with_muon():
    args = (124_475_904, 12, 768, 50304, 16 * 1024)
    matrices = 12 * 12 * 768 * 768
    assert memory.estimate_step_bytes(*args) - memory.estimate_step_bytes(*args, optimizer="muon") == 4 * matrices
    assert (memory.estimate_step_bytes(*args, optimizer_shards=2)
            - memory.estimate_step_bytes(*args, optimizer_shards=2, optimizer="muon")) == 2 * matrices


@scenario
def test_muon_learns_resumes_bit_exactly_after_sigterm_and_sigkill_and_exports_what_transformers_loads(tmp_path):
    from transformers import AutoModelForCausalLM  # here: ~4 s of every pytest worker's collection otherwise

    ref_tmp, tmp = tmp_path / "reference", tmp_path / "killed"
    ref_config, config = tiny_config(ref_tmp, **MUON), tiny_config(tmp, **MUON)
    for c in (ref_config, config):
        write_dataset(c)
    ref = run_to_end(ref_config, ref_tmp)  # uninterrupted
    assert ref["final_val_loss"] < math.log(50304) and ref["steps"] == 8  # below chance: it learns

    # SIGTERM: the step finishes, a checkpoint is written, the process exits as preempted.
    proc, lines = launch(config, tmp), []
    wait_for(proc, "step 3/8", lines)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, lines) == PREEMPTED_EXIT_CODE, "".join(lines[-20:])
    stopped_at = store.load_checkpoint(store.latest_checkpoint(config)).step
    assert 3 <= stopped_at < 8
    if stopped_at < 6:  # then SIGKILL after the resumed attempt's next checkpoint
        proc, lines = launch(config, tmp), []
        wait_for(proc, f"step_{stopped_at + 2 - stopped_at % 2:06d} written", lines)
        sigkill(proc, layout.run_dir(config))
    result = run_to_end(config, tmp)
    assert result["resumed_from_step"] >= 4 and result["final_val_loss"] == ref["final_val_loss"]
    ours, theirs = weights(result["checkpoint"]), weights(ref["checkpoint"])
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    a = storage.read_json(storage.join(result["checkpoint"], store.MARKER))["files"]
    b = storage.read_json(storage.join(ref["checkpoint"], store.MARKER))["files"]
    assert a["optimizer.pt"]["sha256"] == b["optimizer.pt"]["sha256"]
    saved = store.load_checkpoint(result["checkpoint"]).optimizer
    assert [g["algorithm"] for g in saved["param_groups"]] == ["adamw", "adamw", "muon"]

    # The export: the same weights, loaded by transformers with our logits.
    model = GPT(config.model).eval()
    store.load_weights(model, store.load_checkpoint(result["checkpoint"]).model)
    hf = AutoModelForCausalLM.from_pretrained(write_hf_dir(model.state_dict(), config.model, tmp_path / "hf"),
                                              dtype=torch.float32).eval()
    idx = torch.randint(0, 50257, (2, config.model.block_size))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0][..., :50257], rtol=0, atol=1e-5)


@scenario
def test_muon_as_zero1_on_two_gloo_ranks_keeps_shares_and_resumes_across_the_setting(tmp_path):
    """ZeRO-1 gives each rank whole matrices: its share of Muon's state in its
    own file; resumed without ZeRO-1 at step 4, the run ends bit for bit the same."""
    config = tiny_config(tmp_path, **MUON, **{"runtime.shard_optimizer": True})
    write_dataset(config)
    sharded = run_to_end(config, tmp_path, torchrun=2)
    assert sharded["shard_optimizer"] is True and sharded["world_size"] == 2 and sharded["steps"] == 8
    whole = _optimizer_state(sharded["checkpoint"])  # both shares, disjoint, merged
    assert [g["algorithm"] for g in whole["param_groups"]] == ["adamw", "adamw", "muon"]
    assert min(len(s) for s in whole["state"].values()) == 1  # Muon: one buffer a matrix
    _keep_only(config, 4)
    unsharded = run_to_end(tiny_config(tmp_path, **MUON, **{"runtime.shard_optimizer": False}), tmp_path, torchrun=2)
    assert unsharded["resumed_from_step"] == 4 and unsharded["shard_optimizer"] is False
    _assert_same_run(unsharded, sharded)
