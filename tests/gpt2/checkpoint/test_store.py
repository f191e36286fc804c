"""Checkpoint layout, completion marker, verification, pruning, loading."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from gpt2.checkpoint import store
from gpt2.config.identity import train_fingerprint
from gpt2.model import GPT
from gpt2.root import layout, storage
from gpt2.train.optim import make_optimizer
from tests.gpt2.train.fixtures import tiny_config


def _trained_bits(config):
    torch.manual_seed(0)
    model = GPT(config.model)
    opt = make_optimizer(model, config.train, "cpu")
    _, loss = model(torch.randint(0, 50257, (2, 32)), torch.randint(0, 50257, (2, 32)))
    loss.backward()
    opt.step()
    return model, opt


def _save(config, model, opt, step):
    url = layout.checkpoint_dir(layout.run_dir(config), step)
    state = {"step": step, "config": config.model_dump(mode="json"), "loader": {"shard": 0, "offset": 0, "epoch": 0}}
    store.save_checkpoint(url, model, opt, state, {"cpu": torch.get_rng_state()})
    return url


def test_layout_names_and_contents(tmp_path):
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    url = _save(config, model, opt, 500)
    assert url.endswith(f"/runs/synthetic-{train_fingerprint(config)[:12]}/checkpoints/step_000500")
    local = storage.local_path(url)
    assert sorted(p.name for p in local.iterdir()) == ["COMPLETE", "model.safetensors", "optimizer.pt", "rng.pt", "state.json"]
    tensors = load_file(local / "model.safetensors")
    assert "lm_head.weight" not in tensors and "transformer.wte.weight" in tensors
    torch.load(local / "optimizer.pt", weights_only=True)
    torch.load(local / "rng.pt", weights_only=True)
    assert json.loads((local / "state.json").read_text())["step"] == 500
    assert store.latest_checkpoint(config) == url


def test_run_name_ignores_runtime_settings(tmp_path):
    a = tiny_config(tmp_path)
    b = tiny_config(tmp_path, **{"runtime.device": "auto", "runtime.nproc_per_node": 8, "runtime.compile": True,
                                 "eval.limit": 5})
    c = tiny_config(tmp_path, **{"train.lr": 1e-4})
    assert layout.run_name(a) == layout.run_name(b) != layout.run_name(c)


def test_load_model_round_trips_weights_and_config(tmp_path):
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    url = _save(config, model, opt, 2)
    loaded, loaded_config = store.load_model(url)
    assert loaded_config == config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()


def test_only_complete_checkpoints_count(tmp_path):
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    good = _save(config, model, opt, 2)
    half = _save(config, model, opt, 4)
    storage.remove(storage.join(half, store.MARKER))  # as if killed before the marker
    assert store.latest_checkpoint(config) == good
    truncated = _save(config, model, opt, 6)
    path = storage.local_path(storage.join(truncated, "optimizer.pt"))
    path.write_bytes(path.read_bytes()[:100])
    assert store.latest_checkpoint(layout.run_dir(config)) == good


def _flip_byte(checkpoint_url: str, name: str, index: int | None, mask: int) -> None:
    """Flip bits of one byte of a checkpoint's file in place (`index` None: the middle one)."""
    path = storage.local_path(storage.join(checkpoint_url, name))
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if index is None else index] ^= mask
    path.write_bytes(bytes(data))


def test_corrupt_latest_falls_back_with_a_warning(tmp_path, caplog):
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    good = _save(config, model, opt, 2)
    bad = _save(config, model, opt, 4)
    _flip_byte(bad, "model.safetensors", -1, 0xFF)  # same size, so only the checksum notices
    with pytest.raises(store.CheckpointError, match="model.safetensors"):
        store.load_checkpoint(bad)
    ckpt = store.resume_checkpoint(layout.run_dir(config))
    assert ckpt.url == good and ckpt.step == 2
    assert "falling back" in caplog.text and "model.safetensors" in caplog.text
    assert store.latest_checkpoint(config) == good  # the damaged one is gone


def test_prune_keeps_the_newest_k(tmp_path):
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    urls = [_save(config, model, opt, s) for s in (2, 4, 6, 8)]
    leftover = layout.checkpoint_dir(layout.run_dir(config), 9)
    storage.write_bytes_atomic(storage.join(leftover, "model.safetensors"), b"partial")
    store.prune(layout.run_dir(config), keep=2)
    assert store.complete_checkpoints(config) == [urls[3], urls[2]]
    assert not storage.exists(urls[0]) and not storage.exists(leftover)


def test_checkpoints_work_on_an_object_store_root():
    config = tiny_config("memory://ckpt-test")
    model, opt = _trained_bits(config)
    url = _save(config, model, opt, 3)
    assert store.latest_checkpoint(config) == url
    assert store.load_checkpoint(url).step == 3
    loaded, _ = store.load_model(url)
    assert torch.equal(loaded.transformer.wte.weight, model.transformer.wte.weight)
    storage.remove("memory://ckpt-test", recursive=True)


def test_a_snapshot_is_frozen_while_training_goes_on(tmp_path):
    """The background writer serializes the snapshot while the next steps run:
    on a CPU the snapshot must not share storage with the live weights."""
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    tensors, opt_state = store.snapshot(model, opt)
    before = {k: v.clone() for k, v in tensors.items()}
    moments = [s["exp_avg"].clone() for s in opt_state["state"].values()]
    _, loss = model(torch.randint(0, 50257, (2, 32)), torch.randint(0, 50257, (2, 32)))
    loss.backward()
    opt.step()  # what the loop does while the writer thread is still writing
    assert not torch.equal(model.transformer.wte.weight, before["transformer.wte.weight"])
    assert all(torch.equal(tensors[k], before[k]) for k in before)
    assert all(torch.equal(s["exp_avg"], m) for s, m in zip(opt_state["state"].values(), moments))


@pytest.mark.parametrize("marker", ["{}", "[]", '{"step": 4}', '{"step": 4, "files": {"model.safetensors": {}}}'])
def test_a_malformed_marker_counts_as_incomplete(tmp_path, marker):
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    good, bad = _save(config, model, opt, 2), _save(config, model, opt, 4)
    storage.local_path(storage.join(bad, store.MARKER)).write_text(marker)
    assert store.complete_checkpoints(config) == [good]
    assert store.resume_checkpoint(layout.run_dir(config)).step == 2
    with pytest.raises(store.CheckpointError, match="no valid COMPLETE marker"):
        store.load_model(bad)


def test_when_no_checkpoint_verifies_resume_refuses_naming_them(tmp_path):
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    urls = [_save(config, model, opt, step) for step in (2, 4)]
    for url in urls:  # same size, other bytes: only the sha256 can tell
        path = storage.local_path(storage.join(url, "optimizer.pt"))
        data = bytearray(path.read_bytes())
        data[-5] ^= 0x01
        path.write_bytes(bytes(data))
    with pytest.raises(store.CheckpointError) as err:
        store.resume_checkpoint(layout.run_dir(config))
    assert all(url in str(err.value) for url in urls) and "--fresh" in str(err.value)


def test_load_model_refuses_weights_that_do_not_match_the_marker(tmp_path):
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    url = _save(config, model, opt, 2)
    path = storage.local_path(storage.join(url, "model.safetensors"))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(store.CheckpointError, match="model.safetensors does not match"):
        store.load_model(url)


def test_prune_drops_steps_beyond_the_one_just_written(tmp_path):
    """Left by an abandoned timeline, they must never outrank the new checkpoint."""
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    for step in (2, 4, 9):
        _save(config, model, opt, step)
    store.prune(layout.run_dir(config), keep=2, written_step=4)
    assert [u.rsplit("/", 1)[1] for u in store.complete_checkpoints(config)] == ["step_000004", "step_000002"]


def test_a_flipped_byte_in_the_optimizer_state_falls_back_when_resuming_without_decoding_it(tmp_path, caplog):
    """A resume verifies the optimizer files without decoding them (each rank
    reads its own part later, gpt2.checkpoint.optim_load): a damaged one must
    still send the resume to the previous checkpoint."""
    config = tiny_config(tmp_path)
    model, opt = _trained_bits(config)
    good = _save(config, model, opt, 2)
    bad = _save(config, model, opt, 4)
    _flip_byte(bad, "optimizer.pt", None, 0x01)
    ckpt = store.resume_checkpoint(layout.run_dir(config), optimizer=False)
    assert ckpt.url == good and ckpt.optimizer is None and "optimizer.pt" in ckpt.entries
    assert "optimizer.pt" in caplog.text
