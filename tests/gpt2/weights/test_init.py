"""train.init_from (#60): a run that starts from weights. Its first step's loss is transformers'
on the same batch; the weights it starts from are the source's bit for bit (a Hugging Face
directory, our llm.c export); they are fetched into the root once, and a run killed and rerun
ends as an uninterrupted one without reading the source again; bad input is refused in one
line naming the file."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from gpt2.checkpoint.catalog import latest_checkpoint
from gpt2.checkpoint.store import load_model
from gpt2.config.identity import INIT_KEYS, train_identity
from gpt2.data.llmc import read_shard
from gpt2.data.manifest import load_manifest
from gpt2.export.llmc import write_model_bin
from gpt2.model import GPT
from gpt2.root import layout, storage
from gpt2.train.run import train
from gpt2.train.session import InitChanged
from gpt2.weights.init import RECORD, WEIGHTS_FILE, cache_dir, init_weights, with_resolved_init
from gpt2.weights.readers import WeightsError, from_hf_state_dict, read_config
from tests.gpt2.train.fixtures import tiny_config, write_dataset

TINY_HF = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32}  # tiny_config's model


def _hf_dir(path, seed: int = 0, **shape):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50257, activation_function="gelu_new", resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, **{**TINY_HF, **shape})).eval()
    model.save_pretrained(path)
    return path, model


class _Losses:
    """Progress hook: each step's loss; raises after `stop` steps (a kill, in process)."""

    def __init__(self, stop: int | None = None):
        self.losses, self.stop = [], stop

    def __call__(self, info) -> None:
        self.losses.append(info.loss)
        if self.stop is not None and info.step >= self.stop:
            raise RuntimeError(f"stopped by the test after step {self.stop}")


def _final_tensors(config) -> dict[str, torch.Tensor]:
    model, _ = load_model(latest_checkpoint(with_resolved_init(config, fetching=False)))
    return model.state_dict()


def test_a_hugging_face_start_has_transformers_loss_and_its_tensors_bit_for_bit(tmp_path):
    directory, reference = _hf_dir(tmp_path / "hf")
    config = tiny_config(tmp_path, **{"train.init_from": str(directory), "train.micro_batch_size": 8,
                                      "train.max_steps": 1})
    write_dataset(config)
    resolved = with_resolved_init(config)
    assert resolved.model.vocab_size == 50257 and config.model.vocab_size == 50304  # the weights' own rows
    expected = from_hf_state_dict(reference.state_dict(), read_config(directory))
    start = init_weights(resolved)
    assert start.keys() == expected.keys() and all(torch.equal(start[k], expected[k]) for k in expected)

    losses = _Losses()
    result = train(config, progress=losses)
    assert result.run_name == layout.run_name(resolved)
    # The first step's batch, as the loader reads it: the first 8 x 32 + 1 tokens of the first train shard.
    shard = load_manifest(layout.manifest(config)).split("train")[0]
    tokens = torch.from_numpy(read_shard(storage.local_path(layout.shard(layout.manifest(config), shard.path)))
                              [:8 * 32 + 1].astype("int64"))
    x, y = tokens[:-1].view(8, 32), tokens[1:].view(8, 32)
    with torch.no_grad():
        theirs = F.cross_entropy(reference(x).logits.view(-1, 50257), y.reshape(-1)).item()
    assert abs(losses.losses[0] - theirs) <= 1e-5 * theirs


def test_our_llmc_export_starts_a_run_with_its_tensors_bit_for_bit(tmp_path):
    config = tiny_config(tmp_path)
    model = GPT(config.model)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    path = write_model_bin(state, config.model, tmp_path / "gpt2_tiny.bin")
    resolved = with_resolved_init(tiny_config(tmp_path, **{"train.init_from": path.as_uri()}))
    assert resolved.model == config.model  # trained padding (50304 rows) is kept as it is
    start = init_weights(resolved)
    assert start.keys() == state.keys() and all(torch.equal(start[k], state[k]) for k in state)


def test_the_run_is_named_by_the_weights_content_not_their_place(tmp_path):
    first, _ = _hf_dir(tmp_path / "a")
    copy = shutil.copytree(first, tmp_path / "copy")
    other, _ = _hf_dir(tmp_path / "b", seed=1)
    names = [layout.run_name(with_resolved_init(tiny_config(tmp_path, **{"train.init_from": str(p)})))
             for p in (first, copy, other)]
    assert names[0] == names[1] != names[2]
    scratch = tiny_config(tmp_path)
    # A scratch run's identity holds neither key: the older code's identity, so every run keeps its address.
    assert not set(INIT_KEYS) & set(train_identity(scratch)["train"])
    assert names[0] != layout.run_name(scratch)
    record = storage.read_json(storage.join(cache_dir(tiny_config(tmp_path, **{"train.init_from": str(first)})),
                                            RECORD))
    assert record["source"] == str(first) and len(record["sha256"]) == 64


def test_a_fine_tune_killed_and_rerun_ends_as_one_never_stopped_without_the_source(tmp_path):
    directory, _ = _hf_dir(tmp_path / "hf")
    whole = tiny_config(tmp_path / "whole", **{"train.init_from": str(directory), "train.max_steps": 4})
    write_dataset(whole)
    train(whole)
    cut = tiny_config(tmp_path / "cut", **{"train.init_from": str(directory), "train.max_steps": 4})
    write_dataset(cut)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        train(cut, progress=_Losses(stop=3))  # checkpoint_every=2: step 2 is kept, step 3 is lost
    directory.rename(tmp_path / "gone")  # a rerun that read the source again would fail
    result = train(cut)
    assert result.resumed_from_step == 2 and result.steps == 4
    theirs, ours = _final_tensors(whole), _final_tensors(cut)
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_a_damaged_copy_in_the_root_is_refused_naming_it(tmp_path):
    directory, _ = _hf_dir(tmp_path / "hf")
    config = with_resolved_init(tiny_config(tmp_path, **{"train.init_from": str(directory)}))
    copy = storage.local_path(storage.join(cache_dir(config), WEIGHTS_FILE))
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1
    copy.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=rf"{copy.name} has sha256 \w+, its record says \w+: the copy is damaged"):
        init_weights(config)
    pinned = tiny_config(tmp_path, **{"train.init_from": str(directory), "train.init_sha256": "0" * 64})
    with pytest.raises(WeightsError, match="train.init_sha256 asks for 0000"):
        with_resolved_init(pinned)


def test_bad_sources_are_refused_in_one_line_naming_the_file(tmp_path):
    def refused(source, match):
        with pytest.raises(WeightsError, match=match) as err:
            with_resolved_init(tiny_config(tmp_path, **{"train.init_from": str(source)}))
        assert "\n" not in str(err.value)

    refused(tmp_path / "missing", "missing does not exist")
    directory, _ = _hf_dir(tmp_path / "hf")
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    refused(directory, "config.json describes a 'llama' model, not GPT-2")
    (directory / "config.json").write_text(json.dumps({**cfg, "vocab_size": 32000}))
    refused(directory, "vocab_size 32000 is not GPT-2's")
    (directory / "config.json").write_text(json.dumps(cfg))
    (directory / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes()[:1000])
    refused(directory, "model.safetensors cannot be read .* damaged or truncated")
    wide, _ = _hf_dir(tmp_path / "wide", n_embd=64)
    refused(wide, r"have the shape n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=50257, the config "
                  r"asks for n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=50304 \(model.n_embd disagree\)")
    short, _ = _hf_dir(tmp_path / "short", n_positions=16)
    refused(short, r"model.block_size disagree")
    with pytest.raises(WeightsError, match="has not been fetched into"):
        with_resolved_init(tiny_config(tmp_path, **{"train.init_from": str(tmp_path / "elsewhere")}), fetching=False)


def test_init_from_changed_on_a_run_with_checkpoints_is_refused_until_fresh(tmp_path):
    directory, _ = _hf_dir(tmp_path / "hf")
    scratch = tiny_config(tmp_path, **{"train.max_steps": 2})
    write_dataset(scratch)
    train(scratch)
    tuned = tiny_config(tmp_path, **{"train.max_steps": 2, "train.init_from": str(directory)})
    with pytest.raises(InitChanged, match=rf"makes another run .*: run {layout.run_name(scratch)} has the same "
                                          r"settings and checkpoints up to step 2, started from "
                                          r"train.init_from=scratch; .* rerun with --fresh") as err:
        train(tuned)
    assert "\n" not in str(err.value)
    assert train(tuned, fresh=True).steps == 2


def test_gpt2_sample_finds_a_fine_tunes_run_by_its_settings(tmp_path):
    """`gpt2 sample --preset P --set train.init_from=...` reads the fine-tune's newest checkpoint: the
    run named by the weights' sha256, read from the root's record (the source is not needed)."""
    from typer.testing import CliRunner

    from cli.main import app
    from tests.gpt2.train.fixtures import TINY

    directory, _ = _hf_dir(tmp_path / "hf")
    sets = {**TINY, "runtime.work_dir": str(tmp_path / "work"), "train.init_from": str(directory),
            "train.max_steps": 2}
    config = tiny_config(tmp_path, **sets)
    write_dataset(config)
    train(config)
    directory.rename(tmp_path / "gone")
    args = ["sample", "--preset", "smoke", "--root", str(tmp_path), "--prompt", "The cat", "--max-new-tokens", "2",
            "--json", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout.splitlines()[-1])["samples"][0].startswith("The cat")
    other = CliRunner().invoke(app, [*args, "--set", f"train.init_from={tmp_path / 'never'}"])
    assert other.exit_code == 1 and "has not been fetched into" in other.output and "Traceback" not in other.output


def test_a_source_that_does_not_answer_is_named_with_its_url(tmp_path, monkeypatch):
    """The hub unreachable (offline, httpx's ConnectError: not an OSError) is one line naming the URL."""
    from gpt2.weights import source

    class ConnectError(Exception):
        pass

    def unreachable(url):
        raise ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(source.storage, "exists", unreachable)
    with pytest.raises(WeightsError, match=r"^hf://openai-community/gpt2 cannot be read \(ConnectError: \[Errno -2\] "
                                           r"Name or service not known\): check the URL, the network"):
        source.load_source("hf://openai-community/gpt2")


def test_llmcs_zero_padding_is_dropped_so_the_loss_stays_gpt2s(tmp_path):
    """llm.c's gpt2_124M.bin pads OpenAI's 50257 rows with zeros to 50304: read as they are, those
    tokens' logits would be 0, above every real one, in a softmax over every row. They are dropped;
    the run's model has GPT-2's 50257 rows and the loss of the same weights without the padding."""
    config = tiny_config(tmp_path)
    model = GPT(config.model)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["transformer.wte.weight"][50257:] = 0  # as llm.c's export of OpenAI's weights
    path = write_model_bin(state, config.model, tmp_path / "gpt2_124M.bin")
    resolved = with_resolved_init(tiny_config(tmp_path, **{"train.init_from": str(path)}))
    assert resolved.model.vocab_size == 50257
    start = init_weights(resolved)
    assert torch.equal(start["transformer.wte.weight"], state["transformer.wte.weight"][:50257])
    unpadded = GPT(resolved.model)
    unpadded.load_state_dict({**start, "lm_head.weight": start["transformer.wte.weight"]})
    idx = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(0))
    model.load_state_dict({**state, "lm_head.weight": state["transformer.wte.weight"]})
    with torch.no_grad():
        padded_logits, _ = model.eval()(idx)
        logits, _ = unpadded.eval()(idx)
    assert torch.all(padded_logits[..., 50257:] == 0)  # what the dropped rows would have scored
    assert torch.allclose(logits, padded_logits[..., :50257], rtol=0, atol=1e-6)  # the same GPT-2 otherwise


def test_a_remote_hugging_face_directory_is_read_once_and_only_what_it_needs(tmp_path, monkeypatch):
    """Any fsspec URL is a source (memory:// standing in for the hub): its config.json and its
    first weights file are read once, never the second (the hub's gpt2 holds both)."""
    import fsspec

    directory, reference = _hf_dir(tmp_path / "hf")
    fs = fsspec.filesystem("memory")
    for path in directory.iterdir():
        fs.pipe(f"/hub/gpt2-{tmp_path.name}/{path.name}", path.read_bytes())
    fs.pipe(f"/hub/gpt2-{tmp_path.name}/pytorch_model.bin", b"the second weights file, never to be read")
    read, get = [], storage.get_file
    monkeypatch.setattr(storage, "get_file", lambda url, local: read.append(url) or get(url, local))
    config = tiny_config(tmp_path, **{"train.init_from": f"memory://hub/gpt2-{tmp_path.name}"})
    resolved = with_resolved_init(config)
    assert sorted(u.rsplit("/", 1)[-1] for u in read) == ["config.json", "model.safetensors"]
    expected = from_hf_state_dict(reference.state_dict(), read_config(directory))
    assert all(torch.equal(init_weights(resolved)[k], v) for k, v in expected.items())
    with_resolved_init(config)
    assert len(read) == 2  # the root's record answers every later start


def test_a_runs_checkpoint_starts_another_run_with_its_weights_bit_for_bit(tmp_path):
    """Fine-tuning one of our runs: its checkpoint (verified against its marker) is the source, its
    padded vocabulary kept as it trained; the new run's step 0 holds exactly its weights."""
    base = tiny_config(tmp_path, **{"train.max_steps": 2})
    write_dataset(base)
    train(base)
    checkpoint = latest_checkpoint(base)
    tuned = with_resolved_init(tiny_config(tmp_path, **{"train.init_from": checkpoint, "train.lr": 1e-4}))
    assert tuned.model == base.model and layout.run_name(tuned) != layout.run_name(base)
    trained, _ = load_model(checkpoint)
    start = init_weights(tuned)
    assert all(torch.equal(start[k], v) for k, v in trained.state_dict().items() if k != "lm_head.weight")


def test_a_shorter_context_keeps_the_first_positions_as_nanogpt_crops_them(tmp_path):
    directory, reference = _hf_dir(tmp_path / "hf", n_positions=64)  # the config asks for 32 positions
    resolved = with_resolved_init(tiny_config(tmp_path, **{"train.init_from": str(directory)}))
    assert resolved.model.block_size == 32
    wpe = init_weights(resolved)["transformer.wpe.weight"]
    assert torch.equal(wpe, reference.state_dict()["transformer.wpe.weight"][:32])
