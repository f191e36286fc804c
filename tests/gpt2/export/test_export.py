"""Export: the HF directory loads offline with our logits, the llm.c file
reads back with an independent reader, bad destinations leave nothing."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from gpt2.checkpoint.ref import CheckpointNotFound, resolve_checkpoint
from gpt2.checkpoint.store import save_checkpoint
from gpt2.export import writer
from gpt2.export.hf import write_hf_dir
from gpt2.export.llmc import write_model_bin, write_tokenizer_bin
from gpt2.model import GPT
from gpt2.root import layout, storage
from gpt2.root.storage import StorageError
from gpt2.tokenizer import get_encoding

TRICKY = "Hello world!  Zoë’s crème brûlée — 二胡 🚀\n\n<|endoftext|> 12345 don't"


def make_checkpoint(config, step: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(config.model)
    save_checkpoint(layout.checkpoint_dir(layout.run_dir(config), step), model, torch.optim.AdamW(model.parameters()),
                    {"step": step, "config": config.model_dump(mode="json")}, {})
    return model


@pytest.fixture
def model(smoke_config):
    torch.manual_seed(0)
    return GPT(smoke_config().model).eval()


def test_hf_directory_loads_offline_with_our_logits(model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # ~4 s: only where used

    # State dict as torch.compile inside DDP would save it: prefixes stripped.
    state = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    out = write_hf_dir(state, model.config, tmp_path / "hf")
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "vocab.json", "merges.txt"} <= set(os.listdir(out))
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["n_positions"], config["architectures"]) == (50257, 64, ["GPT2LMHeadModel"])
    assert GenerationConfig.from_pretrained(out).eos_token_id == 50256

    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    idx = torch.randint(0, 50257, (2, 64))
    with torch.no_grad():
        ours = model(idx)[0][..., :50257]
        theirs = hf(idx).logits
    assert theirs.shape == (2, 64, 50257)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.encode(TRICKY) == get_encoding("gpt2").encode(TRICKY, allowed_special="all")
    assert tok.decode(tok.encode(TRICKY)) == TRICKY


def read_llmc_model(path):
    """An independent reader of llm.c's model file, after train_gpt2.c's layout."""
    header = np.fromfile(path, dtype=np.int32, count=256)
    magic, version, maxT, V, L, H, C, Vp = header[:8].tolist()
    shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
              ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
              ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
              ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    flat = np.fromfile(path, dtype=np.float32, offset=256 * 4)
    params, at = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        params[name] = flat[at:at + n].reshape(shape)
        at += n
    assert at == flat.size, "file size does not match its header"
    return (magic, version, maxT, V, L, H, C, Vp), params


def test_llmc_model_file_reads_back(model, tmp_path):
    path = write_model_bin(model.state_dict(), model.config, tmp_path / "gpt2.bin")
    cfg = model.config
    header, p = read_llmc_model(path)
    assert header == (20240326, 3, cfg.block_size, 50257, cfg.n_layer, cfg.n_head, cfg.n_embd, 50304)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    np.testing.assert_array_equal(p["wte"], sd["transformer.wte.weight"])
    np.testing.assert_array_equal(p["wpe"], sd["transformer.wpe.weight"])
    for i in range(cfg.n_layer):
        np.testing.assert_array_equal(p["qkvw"][i], sd[f"transformer.h.{i}.attn.c_attn.weight"])
        np.testing.assert_array_equal(p["fcprojw"][i], sd[f"transformer.h.{i}.mlp.c_proj.weight"])
        np.testing.assert_array_equal(p["ln2b"][i], sd[f"transformer.h.{i}.ln_2.bias"])
    np.testing.assert_array_equal(p["lnfw"], sd["transformer.ln_f.weight"])


def test_llmc_tokenizer_file_reads_back(tmp_path):
    data = write_tokenizer_bin(tmp_path / "tok.bin").read_bytes()
    header = np.frombuffer(data[:1024], dtype=np.int32)
    assert header[:4].tolist() == [20240328, 2, 50257, 50256]
    tokens, at = [], 1024
    while at < len(data):
        n = data[at]
        tokens.append(data[at + 1: at + 1 + n])
        at += 1 + n
    enc = get_encoding("gpt2")
    assert len(tokens) == 50257 and tokens[50256] == b"<|endoftext|>"
    assert b"".join(tokens[t] for t in enc.encode_ordinary(TRICKY)) == TRICKY.encode()


def test_export_checkpoint_writes_both_under_the_run(smoke_config):
    config = smoke_config()
    model = make_checkpoint(config, 20)
    make_checkpoint(config, 40, seed=1)
    ref = resolve_checkpoint(config, layout.checkpoint_dir(layout.run_dir(config), 20))
    result = writer.export_checkpoint(ref, config.runtime.root)
    assert result.export_dir == f"{layout.run_dir(config)}/export/step_000020"
    assert result.llmc_bin.endswith("/llmc/gpt2_3M.bin")
    manifest = storage.read_json(storage.join(result.export_dir, "manifest.json"))
    assert manifest["step"] == 20 and "hf/model.safetensors" in manifest["files"]
    _, p = read_llmc_model(storage.local_path(result.llmc_bin))
    np.testing.assert_array_equal(p["wte"], model.transformer.wte.weight.detach().numpy())
    assert resolve_checkpoint(config, "latest").step == 40
    # Same weights again: reused, not rewritten.
    mtime = os.path.getmtime(storage.local_path(storage.join(result.export_dir, "manifest.json")))
    assert writer.export_checkpoint(ref, config.runtime.root) == result
    assert os.path.getmtime(storage.local_path(storage.join(result.export_dir, "manifest.json"))) == mtime


def test_missing_checkpoints_are_clear_errors(smoke_config, tmp_path):
    config = smoke_config()
    with pytest.raises(CheckpointNotFound, match=r"no complete checkpoint under .*/runs/.*/checkpoints"):
        resolve_checkpoint(config, "latest")
    with pytest.raises(CheckpointNotFound, match="does not exist or is incomplete"):
        resolve_checkpoint(config, str(tmp_path / "nowhere" / "step_000001"))
    make_checkpoint(config, 20)
    url = layout.checkpoint_dir(layout.run_dir(config), 20)
    storage.remove(storage.join(url, "COMPLETE"))
    with pytest.raises(CheckpointNotFound, match="incomplete"):
        resolve_checkpoint(config, url)


def test_export_to_an_unwritable_root_leaves_nothing(smoke_config, tmp_path):
    config = smoke_config()
    make_checkpoint(config, 20)
    ref = resolve_checkpoint(config, "latest")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="a-file/root is not writable"):
        writer.export_checkpoint(ref, str(blocker / "root"))
    assert not storage.exists(writer.export_dir_url(ref, config.runtime.root))


def test_a_failed_upload_removes_the_partial_export(smoke_config, monkeypatch):
    config = smoke_config()
    make_checkpoint(config, 20)
    ref = resolve_checkpoint(config, "latest")
    real, calls = storage.put_file_atomic, []

    def flaky(local, url):  # the third file's upload breaks off
        calls.append(url)
        if len(calls) == 3:
            raise OSError("connection reset")
        real(local, url)

    monkeypatch.setattr(writer.storage, "put_file_atomic", flaky)
    with pytest.raises(writer.ExportError, match="nothing was kept"):
        writer.export_checkpoint(ref, config.runtime.root)
    assert not storage.exists(writer.export_dir_url(ref, config.runtime.root))


def test_tampered_tokenizer_files_are_not_exported(tmp_path, monkeypatch):
    """The HF directory's vocab.json and merges.txt are the bytes checked
    against tiktoken's pinned sha256: one flipped byte is an error, not an export."""
    import shutil

    from gpt2.export import hf
    from gpt2.tokenizer import TokenizerFilesError, bpe_files_dir

    files = tmp_path / "bpe"
    shutil.copytree(bpe_files_dir(), files)
    merges = bytearray((files / "vocab.bpe").read_bytes())
    merges[-2] ^= 1
    (files / "vocab.bpe").write_bytes(bytes(merges))
    monkeypatch.setattr(hf, "bpe_files_dir", lambda: files)
    with pytest.raises(TokenizerFilesError, match="vocab.bpe"):
        hf.write_tokenizer(tmp_path / "out", max_length=1024)
    assert not (tmp_path / "out" / "merges.txt").exists()
