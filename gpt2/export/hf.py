"""Our GPT as a Hugging Face `GPT2LMHeadModel` directory.

The conversion is a fixed table: same parameter names (both follow OpenAI's
GPT-2), but HF keeps c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj as Conv1D,
whose weight is the transpose of nn.Linear's; the padded vocabulary rows
(50,304 → 50,257) are dropped; `_orig_mod.` (torch.compile) and `module.`
(DDP) prefixes are stripped. The directory loads offline in `transformers`
and `lm-eval --model hf`, tokenizer included.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gpt2.config.sections import ModelConfig
from gpt2.tokenizer import EOT_TOKEN, N_VOCAB, bpe_files_dir, verify_bpe_files

if TYPE_CHECKING:  # transformers takes seconds to import: only the functions that build HF objects load it
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
PREFIXES = ("_orig_mod.", "module.")
VOCAB_ROWS = ("transformer.wte.weight", "lm_head.weight")


def clean_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip wrapper prefixes (in any nesting: DDP around a compiled model)."""
    out = {}
    for key, value in state.items():
        while key.startswith(PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def to_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state_dict (tied head present or not) → GPT2LMHeadModel's, fp32."""
    out = {}
    for key, value in clean_state_dict(state).items():
        if key == "lm_head.weight":
            continue  # tied to wte: HF re-ties it on load
        value = value.detach().to("cpu", torch.float32)
        if key.endswith(CONV1D):
            value = value.t()  # nn.Linear (out, in) -> Conv1D (in, out)
        if key in VOCAB_ROWS:
            value = value[:N_VOCAB]  # drop the padding rows
        out[key] = value.contiguous()
    return out


def hf_config(cfg: ModelConfig) -> GPT2Config:
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=N_VOCAB,
        n_positions=cfg.block_size,
        # The same length under the name older GPT-2 readers take it from:
        # llama.cpp's converter (conversion/gpt2.py, GPT2Model) reads n_ctx.
        n_ctx=cfg.block_size,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        activation_function="gelu_new",  # tanh approximation, as our model
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=EOT_TOKEN,
        eos_token_id=EOT_TOKEN,
        tie_word_embeddings=True,
        architectures=["GPT2LMHeadModel"],
    )


def generation_config(cfg: ModelConfig) -> GenerationConfig:
    """What `generate()` and `pipeline("text-generation")` do when asked for
    nothing: sample (top-k 50, as llm.c and build-nanogpt sample) until the
    end-of-text token, never past the model's positions. Without a length the
    pipeline adds 256 new tokens to any prompt and runs off the position table
    (IndexError); `max_length`, not `max_new_tokens`, because it caps the prompt
    and the answer together."""
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=EOT_TOKEN, eos_token_id=EOT_TOKEN, pad_token_id=EOT_TOKEN,
                            max_length=cfg.block_size, do_sample=True, top_k=50)


def build_hf_model(state: dict[str, torch.Tensor], cfg: ModelConfig) -> GPT2LMHeadModel:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(hf_config(cfg))
    missing, unexpected = model.load_state_dict(to_hf_state_dict(state), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")]
    if missing or unexpected:
        raise ValueError(f"state_dict does not fit GPT2LMHeadModel: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.eval()


def write_tokenizer(out_dir: Path, max_length: int) -> None:
    """GPT-2's tokenizer files (vocab.json, merges.txt, tokenizer.json, configs)
    built from the same verified BPE files tiktoken uses: encoder.json is
    vocab.json and vocab.bpe is merges.txt."""
    from transformers import GPT2TokenizerFast

    src = bpe_files_dir()
    files = verify_bpe_files(src)  # what is written is what was checked against tiktoken's pins
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.json").write_bytes(files["encoder.json"])
        (Path(tmp) / "merges.txt").write_bytes(files["vocab.bpe"])
        # from_pretrained on a directory: GPT2TokenizerFast(vocab_file=...)
        # silently builds an empty tokenizer in transformers 5.
        tok = GPT2TokenizerFast.from_pretrained(tmp, model_max_length=max_length)
    if len(tok) != N_VOCAB:
        raise ValueError(f"tokenizer built from {src} has {len(tok)} tokens, expected {N_VOCAB}")
    tok.save_pretrained(out_dir)
    for name, target in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        (out_dir / target).write_bytes(files[name])  # slow-tokenizer files as well


def write_hf_dir(state: dict[str, torch.Tensor], cfg: ModelConfig, out_dir: Path) -> Path:
    """Write a complete HF model directory (safetensors, config.json,
    generation_config.json, tokenizer) to a local `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = build_hf_model(state, cfg)
    model.generation_config = generation_config(cfg)
    model.save_pretrained(out_dir, safe_serialization=True)
    write_tokenizer(out_dir, cfg.block_size)
    return out_dir
