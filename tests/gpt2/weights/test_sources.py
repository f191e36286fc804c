"""Weights from any of their homes into our GPT (#60): a Hugging Face GPT-2 directory (against
transformers' own model on the same tensors), llm.c's model file and a run's checkpoint (bit for
bit), and what is not GPT-2's refused in one line naming the file."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2.checkpoint.store import model_tensors, save_checkpoint
from gpt2.config.sections import ModelConfig
from gpt2.export.hf import to_hf_state_dict
from gpt2.export.llmc import write_model_bin
from gpt2.model import GPT
from gpt2.weights.readers import WeightsError
from gpt2.weights.source import load_source, model_from

SMALL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32}


def _hf_model(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=50257, activation_function="gelu_new", resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, **SMALL)).eval()


@pytest.fixture
def hf_dir(tmp_path):
    model = _hf_model()
    model.save_pretrained(tmp_path / "hf")
    return tmp_path / "hf", model


def test_a_hugging_face_gpt2_gives_transformers_logits_and_loss(hf_dir):
    directory, reference = hf_dir
    ours = model_from(str(directory))
    assert (ours.config.n_layer, ours.config.n_embd, ours.config.block_size, ours.config.vocab_size) == (2, 32, 32, 50257)
    idx = torch.randint(0, 50257, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = reference(idx, labels=idx)
        logits, _ = ours(idx)
        _, loss = ours(idx[:, :-1], targets=idx[:, 1:])
    assert torch.allclose(logits, theirs.logits, rtol=1e-5, atol=1e-5)
    assert abs(loss.item() - theirs.loss.item()) <= 1e-5 * abs(theirs.loss.item())


def test_our_export_and_llmc_file_read_back_bit_for_bit(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32)
    model = GPT(cfg)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    write_model_bin(state, cfg, tmp_path / "model.bin")
    shape, tensors = load_source(str(tmp_path / "model.bin"))
    assert shape == cfg and tensors.keys() == state.keys()
    assert all(torch.equal(tensors[k], state[k]) for k in state)  # llm.c keeps the padded rows too

    hf = GPT2LMHeadModel(GPT2Config(vocab_size=50257, **SMALL))
    hf.load_state_dict(to_hf_state_dict(model.state_dict()), strict=False)
    hf.save_pretrained(tmp_path / "hf")
    shape, tensors = load_source((tmp_path / "hf").as_uri())
    assert shape.vocab_size == 50257  # HF keeps GPT-2's rows only: our padded ones are not in the export
    for name, value in state.items():
        rows = 50257 if name == "transformer.wte.weight" else value.shape[0]
        assert torch.equal(tensors[name], value[:rows]), name


def test_a_checkpoint_of_a_run_is_a_source(tmp_path):
    from gpt2.config.overrides import resolve_config

    config = resolve_config("smoke", root=str(tmp_path / "root"))
    model = GPT(config.model)
    optimizer = torch.optim.AdamW(model.parameters())
    url = (tmp_path / "ckpt" / "step_000001").as_uri()
    save_checkpoint(url, model, optimizer, {"step": 1, "config": config.model_dump(mode="json")},
                    {"torch": torch.get_rng_state()})
    shape, tensors = load_source(url)
    assert shape == config.model
    assert all(torch.equal(tensors[k], v) for k, v in model_tensors(model).items() if k in tensors)


def test_what_is_not_gpt2_is_refused_naming_the_file(hf_dir, tmp_path):
    directory, _ = hf_dir
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(WeightsError, match=r"config.json describes a 'llama' model, not GPT-2"):
        load_source(str(directory))
    (directory / "config.json").write_text(json.dumps({**config, "vocab_size": 32000}))
    with pytest.raises(WeightsError, match="vocab_size 32000 is not GPT-2's"):
        load_source(str(directory))
    (directory / "config.json").write_text(json.dumps(config))
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a download cut short
    with pytest.raises(WeightsError, match=r"model.safetensors cannot be read .* damaged or truncated"):
        load_source(str(directory))

    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32)
    state = {k: v for k, v in GPT(cfg).state_dict().items() if k != "lm_head.weight"}
    path = write_model_bin(state, cfg, tmp_path / "cut.bin")
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(WeightsError, match=r"cut.bin holds .* bytes, its header says .*: the file is truncated"):
        load_source(str(path))
    with pytest.raises(WeightsError, match="missing does not exist"):
        load_source(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match="holds no weights this project reads"):
        load_source(str(tmp_path / "empty"))


def test_gpt2_sample_is_reproducible_and_greedy_as_transformers(hf_dir):
    from typer.testing import CliRunner

    from cli.main import app
    from gpt2.tokenizer import get_encoding

    directory, reference = hf_dir
    args = ["sample", "--from", str(directory), "--prompt", "The cat", "--max-new-tokens", "8", "--json"]
    drawn = [json.loads(CliRunner().invoke(app, [*args, "--seed", "7", "--num", "2"]).stdout.splitlines()[-1])
             for _ in range(2)]
    assert drawn[0]["samples"] == drawn[1]["samples"] and len(drawn[0]["samples"]) == 2
    assert all(text.startswith("The cat") for text in drawn[0]["samples"])

    missing = CliRunner().invoke(app, ["sample", "--from", str(directory / "nope")])
    assert missing.exit_code == 1 and "nope does not exist" in missing.output and "Traceback" not in missing.output

    out = CliRunner().invoke(app, [*args, "--top-k", "1"])
    assert out.exit_code == 0, out.output
    (greedy,) = json.loads(out.stdout.splitlines()[-1])["samples"]
    enc = get_encoding()
    ids = torch.tensor([enc.encode("The cat")])
    expected = reference.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=50256)
    assert greedy == enc.decode(expected[0].tolist())
