"""The HF directory as tools we did not write read it: llama.cpp's GPT-2
converter finds every key it reads, `pipeline("text-generation")` answers
with no arguments at 64 positions and at 1,024, and the directory carries a
model card that says what the model is."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2.checkpoint.ref import resolve_checkpoint
from gpt2.checkpoint.store import save_checkpoint
from gpt2.config.sections import ModelConfig
from gpt2.export import writer
from gpt2.export.hf import write_hf_dir
from gpt2.eval.hellaswag.evaluate import result_url
from gpt2.model import GPT
from gpt2.root import layout, storage
from gpt2.tokenizer import get_encoding

# What llama.cpp's convert_hf_to_gguf.py reads from config.json for a
# GPT2LMHeadModel, from its source (llama.cpp's conversion/gpt2.py, class
# GPT2Model.set_gguf_parameters: n_ctx, n_embd, n_head, layer_norm_epsilon;
# conversion/base.py, TextModel.__init__: the block count under one of
# n_layers/num_hidden_layers/n_layer/num_layers, and `architectures` to pick
# the class; get_vocab_base: vocab_size). Without n_ctx it stops with KeyError.
LLAMA_CPP_GPT2_KEYS = ("architectures", "n_ctx", "n_embd", "n_head", "n_layer", "layer_norm_epsilon", "vocab_size")


def hf_dir(tmp_path, block_size: int, **model):
    shape = {"n_layer": 2, "n_head": 2, "n_embd": 64, **model}
    cfg = ModelConfig(**shape, vocab_size=50304, block_size=block_size)
    torch.manual_seed(0)
    return write_hf_dir(GPT(cfg).state_dict(), cfg, tmp_path / "hf")


def test_config_json_has_every_key_llama_cpps_gpt2_converter_reads(tmp_path):
    config = json.loads((hf_dir(tmp_path, 64) / "config.json").read_text())
    assert {k: k in config for k in LLAMA_CPP_GPT2_KEYS} == dict.fromkeys(LLAMA_CPP_GPT2_KEYS, True)
    assert config["architectures"] == ["GPT2LMHeadModel"]
    assert config["n_ctx"] == config["n_positions"] == 64
    assert (config["n_embd"], config["n_head"], config["n_layer"], config["layer_norm_epsilon"]) == (64, 2, 2, 1e-5)


@pytest.mark.parametrize("block_size", [64, 1024])
def test_text_generation_pipeline_answers_with_no_arguments(tmp_path, block_size):
    """The pipeline's own default (256 new tokens) would run a prompt of most
    of the positions off the position table; the export's generation config
    stops at the last position instead, and at the end-of-text token."""
    from transformers import GenerationConfig, pipeline

    # 1,024 positions on a 1-layer, 16-channel model: the length is what is tested, not the width.
    out = hf_dir(tmp_path, block_size, **({} if block_size == 64 else {"n_layer": 1, "n_head": 1, "n_embd": 16}))
    enc = get_encoding("gpt2")
    words = " ".join(f"word{i}" for i in range(block_size))
    prompt = enc.decode(enc.encode(words)[: block_size - 10])  # 10 positions left, a long way short of 256
    answer = pipeline("text-generation", model=str(out))(prompt)[0]["generated_text"]
    assert answer.startswith(prompt)
    assert len(enc.encode(answer, allowed_special="all")) <= block_size + 1  # +1: re-encoding may merge across the seam
    generation = GenerationConfig.from_pretrained(out)
    assert generation.max_length == block_size
    assert generation.eos_token_id == generation.pad_token_id == 50256


def make_checkpoint(config, step: int, state: dict) -> None:
    torch.manual_seed(0)
    model = GPT(config.model)
    save_checkpoint(layout.checkpoint_dir(layout.run_dir(config), step), model, torch.optim.AdamW(model.parameters()),
                    {"step": step, "config": config.model_dump(mode="json"), **state}, {})


def eval_result(ref, hellaswag: dict, benchmark: bool, source: str) -> dict:
    return {"hellaswag": hellaswag, "benchmark": benchmark, "source": source, "model_sha256": ref.model_sha256,
            "step": ref.step}


def read_card(result) -> str:
    return storage.read_bytes(storage.join(result.hf_dir, "README.md")).decode()


def test_the_export_carries_a_model_card_that_follows_the_evaluation(smoke_config):
    config = smoke_config(**{"train.max_steps": 20})
    make_checkpoint(config, 20, {"val_loss": 7.6543, "val_loss_step": 20, "tokens_seen": 20_480})
    ref = resolve_checkpoint(config, "latest")
    card = read_card(writer.export_checkpoint(ref, config.runtime.root))
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation\n")
    for fact in ("2 layers, 2 heads, 64 channels, 64 positions", "20,480 tokens of `builtin:python-docs`",
                 "**Final validation loss**: 7.6543 (at step 20)", "**HellaSwag**: not evaluated yet",
                 "`gpt2 run --preset smoke --set train.max_steps=20`", "**Code version**: gpt2-pipeline "):
        assert fact in card, fact

    # An evaluation written after the export: the export is stale and is written again with it.
    sample = {"acc": 0.25, "acc_norm": 0.3125, "n": 32}
    storage.write_record(result_url(ref, config.runtime.root), eval_result(ref, sample, False, "builtin:format-sample"))
    assert not writer.export_complete(writer.export_dir_url(ref, config.runtime.root), ref, config.runtime.root)
    card = read_card(writer.export_checkpoint(ref, config.runtime.root))
    assert ("acc_norm 0.3125, acc 0.2500 on 32 items of `builtin:format-sample`: the built-in format sample, "
            "NOT the benchmark") in card

    bench = {"acc": 0.2891, "acc_norm": 0.2945, "n": 10042}
    hub = eval_result(ref, bench, True, "hf://datasets/Rowan/hellaswag")
    storage.write_record(result_url(ref, config.runtime.root), hub)
    card = read_card(writer.export_checkpoint(ref, config.runtime.root))
    assert "acc_norm 0.2945, acc 0.2891 on 10,042 items of the HellaSwag validation set" in card
    assert "NOT the benchmark" not in card


def test_a_fine_tunes_card_names_the_weights_it_started_from():
    """#60: a fine-tune's card says where its weights started (and their sha256), not "from scratch";
    its vocabulary is GPT-2's 50,257 rows, unpadded."""
    from gpt2.config.overrides import resolve_config
    from gpt2.export.card import CardFacts, card_body

    tuned = resolve_config("smoke", {"train.init_from": "hf://openai-community/gpt2", "train.init_sha256": "a" * 64,
                                     "model.vocab_size": 50257})
    body = card_body(CardFacts(tuned, 4, {}, None, "dev"))
    assert (f"GPT-2 fine-tuned by gpt2-pipeline (preset `smoke`) from the weights of `hf://openai-community/gpt2` "
            f"(sha256 {'a' * 64}), checkpoint at step 4.") in body
    assert "vocabulary 50,257 (GPT-2's BPE), tied" in body and "from scratch" not in body
    scratch = card_body(CardFacts(resolve_config("smoke"), 4, {}, None, "dev"))
    assert "GPT-2 trained from scratch by gpt2-pipeline" in scratch and "trained padded to 50304" in scratch
