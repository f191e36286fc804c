"""The optimizer state stored as one share per rank: real gloo process groups
where every rank's CheckpointWriter writes its own file, checkpoints that load
into any number of ranks and either setting, the layout written before shares
existed, and a failure on one rank failing the save on all of them."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt2.checkpoint import shares, store
from gpt2.checkpoint.optim_share import state_share
from gpt2.checkpoint.writer import CheckpointWriter
from gpt2.model import GPT
from gpt2.root import layout, storage
from gpt2.train.optim import load_state, local_part, make_optimizer
from tests.gpt2.train.fixtures import tiny_config
from tests.tiers import scenario

# Ranks spawned from the warm interpreter (tests/warm_python): gloo and the code under test unchanged.
pytestmark = pytest.mark.usefixtures("warm_spawn")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trained(config, shard: bool) -> tuple[GPT, torch.optim.Optimizer]:
    """Two AdamW steps on the same batch: every rank computes the same gradients."""
    torch.manual_seed(0)
    model = GPT(config.model)
    opt = make_optimizer(model, config.train, "cpu", shard)
    batch = torch.randint(0, config.model.vocab_size, (2, config.model.block_size), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        opt.zero_grad()
        model(batch, batch)[1].backward()
        opt.step()
    return model, opt


def _state(config, step: int) -> dict:
    return {"step": step, "config": config.model_dump(mode="json")}


class _Fenced(RuntimeError):
    pass


def _fence() -> None:
    raise _Fenced("the lease moved to another trainer")


def _rank(rank: int, world: int, port: int, root: str, shard: bool, fence: bool, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        config = tiny_config(root)
        model, opt = _trained(config, shard)
        run_dir = layout.run_dir(config)
        # A checkpoint already there (another layout) is loaded before this one replaces it.
        before = store.latest_checkpoint(config)
        same = _resumes_the_same(config, opt, before, shard) if before else None
        dist.barrier()
        writer = CheckpointWriter(run_dir, keep=3, fence=_fence if fence and rank == 0 else None)
        url = layout.checkpoint_dir(run_dir, 2)
        error = None
        try:
            writer.submit(url, model, opt, _state(config, 2), {"cpu": torch.get_rng_state()})
            writer.close()
        except Exception as err:  # noqa: BLE001 - reported to the test
            error = f"{type(err).__name__}: {err}"
        if error is None and before is None:
            same = _resumes_the_same(config, opt, url, shard)
        out.put((rank, error, same))
    finally:
        dist.destroy_process_group()


def _resumes_the_same(config, opt, url: str, shard: bool) -> bool:
    """What a resumed rank does: the whole state from the files, loaded into
    its own optimizer; it must equal the state this rank keeps."""
    fresh = make_optimizer(GPT(config.model), config.train, "cpu", shard)
    load_state(fresh, store.load_checkpoint(url).optimizer)
    mine, theirs = local_part(opt).state_dict()["state"], local_part(fresh).state_dict()["state"]
    return mine.keys() == theirs.keys() and all(torch.equal(mine[i][k], theirs[i][k]) for i in mine for k in mine[i])


def _run(world: int, root, shard: bool, fence: bool = False) -> dict:
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, str(root), shard, fence, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {rank: (error, same) for rank, error, same in (out.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def _reference_state(config) -> dict:
    return _trained(config, shard=False)[1].state_dict()


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for i, state in b["state"].items():
        assert all(torch.equal(a["state"][i][k], v) for k, v in state.items())


@pytest.mark.parametrize("world,shard", [(2, True), (3, False)])
@scenario
def test_each_rank_writes_its_share_and_any_setting_loads_the_whole(tmp_path, world, shard):
    results = _run(world, tmp_path, shard)
    assert results == {r: (None, True) for r in range(world)}  # each rank resumed exactly its own state

    config = tiny_config(tmp_path)
    url = store.latest_checkpoint(config)
    names = shares.optimizer_files(store.read_marker(url)["files"])
    assert names == [shares.share_name(r, world) for r in range(world)]
    parts = [torch.load(storage.local_path(storage.join(url, n)), weights_only=True) for n in names]
    assert all(p["state"] for p in parts)  # the work is split: every rank wrote part of the state
    assert sum(len(p["state"]) for p in parts) == len(set().union(*(p["state"] for p in parts)))
    # One process, plain AdamW, loads what the ranks wrote: the state of an unsharded run.
    whole = store.load_checkpoint(url).optimizer
    _assert_same_state(whole, _reference_state(config))
    fresh = make_optimizer(GPT(config.model), config.train, "cpu")
    load_state(fresh, whole)
    _assert_same_state(fresh.state_dict(), _reference_state(config))


@scenario
def test_the_exports_come_from_a_checkpoint_written_in_shares(tmp_path):
    from gpt2.checkpoint.ref import resolve_checkpoint
    from gpt2.export.writer import build_local, card_facts

    assert _run(2, tmp_path, shard=True) == {0: (None, True), 1: (None, True)}
    config = tiny_config(tmp_path)
    ref = resolve_checkpoint(config)
    files = build_local(ref, tmp_path / "export", card_facts(ref, config.runtime.root))
    assert "hf/model.safetensors" in files and any(n.startswith("llmc/") and n.endswith(".bin") for n in files)
    trained = _trained(config, shard=False)[0].state_dict()
    loaded = store.load_model(ref.url)[0].state_dict()
    assert all(torch.equal(trained[k], loaded[k]) for k in trained)


@scenario
def test_a_checkpoint_in_the_layout_before_shares_loads_into_zero_on_two_ranks(tmp_path):
    """Written as releases before shares did (one optimizer.pt with the whole
    state, the marker naming the four files), it resumes under ZeRO-1."""
    config = tiny_config(tmp_path)
    model, opt = _trained(config, shard=False)
    url = layout.checkpoint_dir(layout.run_dir(config), 2)
    store.write_files(url, store.encode_checkpoint(store.model_tensors(model), opt.state_dict(), _state(config, 2),
                                                  {"cpu": torch.get_rng_state()}), 2)
    assert sorted(store.read_marker(url)["files"]) == sorted(store.FILES)
    # Each rank loads it (the resume path: load_checkpoint, then load_state) and
    # checks its ZeRO share against its own live state, then saves step 2 again, in shares.
    assert _run(2, tmp_path, shard=True) == {0: (None, True), 1: (None, True)}
    assert shares.optimizer_files(store.read_marker(url)["files"]) == [shares.share_name(r, 2) for r in range(2)]


@scenario
def test_a_failure_on_one_rank_fails_the_save_on_every_rank_and_commits_nothing(tmp_path):
    results = _run(2, tmp_path, shard=True, fence=True)
    assert results[0][0].startswith("_Fenced: the lease moved")  # where it happened: its own error
    assert results[1][0].startswith("CheckpointError") and "failed on rank 0" in results[1][0]
    assert "the lease moved" in results[1][0]
    assert store.latest_checkpoint(tiny_config(tmp_path)) is None


def test_a_checkpoint_missing_a_share_is_incomplete(tmp_path):
    config = tiny_config(tmp_path)
    model, opt = _trained(config, shard=False)
    url = layout.checkpoint_dir(layout.run_dir(config), 2)
    blobs = store.encode_required(store.model_tensors(model), _state(config, 2), {"cpu": torch.get_rng_state()})
    blobs.update({shares.share_name(r, 3): store.encode_optimizer(state_share(opt, r, 3)) for r in range(3)})
    store.write_files(url, blobs, 2)
    assert store.latest_checkpoint(config) == url
    marker = store.read_marker(url)
    del marker["files"][shares.share_name(1, 3)]
    storage.write_record(storage.join(url, store.MARKER), marker)
    assert store.read_marker(url) is None and store.latest_checkpoint(config) is None
    with pytest.raises(store.CheckpointError, match="not a whole checkpoint"):
        store.write_marker(url, 2, marker["files"])


def test_optimizer_file_sets():
    assert shares.optimizer_files(["optimizer.pt", "state.json"]) == ["optimizer.pt"]
    whole = [shares.share_name(r, 4) for r in range(4)]
    assert shares.optimizer_files(whole[::-1]) == whole
    assert shares.optimizer_files(whole[:3]) is None
    assert shares.optimizer_files(whole + ["optimizer.pt"]) is None
    assert shares.optimizer_files(whole + [shares.share_name(0, 2)]) is None
    assert shares.optimizer_files([]) is None


def test_the_partition_balances_bytes_and_merge_refuses_mixed_shares(tmp_path):
    sizes = [p.numel() for p in GPT(tiny_config(tmp_path).model).parameters()]
    for world in (2, 3, 8):
        owner = shares.partition(sizes, world)
        loads = [sum(s for s, o in zip(sizes, owner) if o == r) for r in range(world)]
        assert max(loads) - min(loads) <= max(sizes)  # greedy, largest first: within one parameter
    a = {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"params": [0, 1]}]}
    with pytest.raises(ValueError, match="repeats the state of parameter"):
        shares.merge([a, a], ["x", "y"])
    with pytest.raises(ValueError, match="other parameter groups"):
        shares.merge([a, {"state": {}, "param_groups": [{"params": [1, 0]}]}], ["x", "y"])
