"""Each format's reader into our GPT's tensors: a Hugging Face GPT-2 directory (the inverse of
gpt2.export.hf) and llm.c's model file (the inverse of gpt2.export.llmc).

HF keeps c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj as Conv1D (the transpose of our
nn.Linear); its head is tied to the embedding, as ours. Its vocabulary keeps GPT-2's 50257
rows: padded with zero rows to the presets' 50304, the padded tokens' logits would be 0, far
above GPT-2's real ones, and our loss (a softmax over every row, as a from-scratch run learns
them) would no longer be GPT-2's; the model is built with the weights' own 50257. Buffers HF
keeps per block (`attn.bias`, `attn.masked_bias`) are not weights and are left out.

llm.c's file is a 256-int32 header (magic 20240326, version 3 for fp32, 5 for bf16; maxT, V,
L, NH, C, Vp), then every tensor in its fixed order, nn.Linear's layout, the embedding with its
padded rows (zeros in llm.c's gpt2_124M.bin: gpt2.weights.source drops those).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from gpt2.config.sections import ModelConfig
from gpt2.export.hf import CONV1D, VOCAB_ROWS
from gpt2.export.llmc import HEADER_INTS, MODEL_MAGIC, MODEL_VERSION_FP32, tensor_order
from gpt2.model import GPT
from gpt2.tokenizer import N_VOCAB
from gpt2.weights.errors import PADDED_VOCAB, WeightsError  # noqa: F401 (both also read from here)

MODEL_VERSION_BF16 = 5


def read_config(directory: Path) -> ModelConfig:
    """The model's shape from its config.json; another architecture or vocabulary is refused."""
    path = directory / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise WeightsError(f"{path} does not exist: a Hugging Face GPT-2 directory holds config.json "
                           "and model.safetensors (or pytorch_model.bin)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise WeightsError(f"{path} is not valid JSON ({err})") from None
    if cfg.get("model_type") != "gpt2":
        raise WeightsError(f"{path} describes a {cfg.get('model_type')!r} model, not GPT-2 (model_type 'gpt2'): "
                           "only GPT-2's architecture can be loaded into this project's model")
    if cfg.get("vocab_size") not in (N_VOCAB, PADDED_VOCAB):
        raise WeightsError(f"{path}: vocab_size {cfg.get('vocab_size')} is not GPT-2's ({N_VOCAB}, or "
                           f"{PADDED_VOCAB} padded): the tokenizer would not match")
    return ModelConfig(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                       block_size=cfg.get("n_positions") or cfg.get("n_ctx") or 1024, vocab_size=cfg["vocab_size"])


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    safetensors, pickled = directory / "model.safetensors", directory / "pytorch_model.bin"
    try:
        if safetensors.exists():
            from safetensors.torch import load_file

            return load_file(str(safetensors))
        if pickled.exists():
            return torch.load(pickled, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - a truncated or damaged file: name it, and what the reader said
        name = safetensors if safetensors.exists() else pickled
        raise WeightsError(f"{name} cannot be read ({type(err).__name__}: {str(err)[:200]}): the file is "
                           "damaged or truncated; download it again") from None
    raise WeightsError(f"{directory} holds neither model.safetensors nor pytorch_model.bin")


def from_hf_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel's tensors -> ours (fp32, vocabulary padded, head tied: left out)."""
    out = {}
    for key, value in state.items():
        if not key.startswith("transformer."):
            key = f"transformer.{key}"  # GPT2Model's own files name tensors without the prefix
        if key.endswith((".attn.bias", ".attn.masked_bias")) or key.startswith("transformer.lm_head"):
            continue
        value = value.to(torch.float32)
        if key.endswith(CONV1D):
            value = value.t()  # Conv1D (in, out) -> nn.Linear (out, in)
        if key in VOCAB_ROWS and value.shape[0] < cfg.vocab_size:
            value = torch.cat([value, value.new_zeros(cfg.vocab_size - value.shape[0], value.shape[1])])
        out[key] = value.contiguous()
    return out


def load_hf_dir(directory: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    cfg = read_config(directory)
    return cfg, from_hf_state_dict(_read_tensors(directory), cfg)


def load_llmc_bin(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """llm.c's model file (fp32 or bf16) -> (its shape, our tensors)."""
    raw = path.read_bytes()
    header = np.frombuffer(raw[:4 * HEADER_INTS], dtype=np.int32)
    if len(header) < 8 or header[0] != MODEL_MAGIC or header[1] not in (MODEL_VERSION_FP32, MODEL_VERSION_BF16):
        raise WeightsError(f"{path} is not an llm.c model file (its header has magic {MODEL_MAGIC} and version "
                           f"{MODEL_VERSION_FP32} or {MODEL_VERSION_BF16})")
    max_t, vocab, n_layer, n_head, n_embd, padded = (int(x) for x in header[2:8])
    if vocab != N_VOCAB:
        raise WeightsError(f"{path}: a vocabulary of {vocab} is not GPT-2's {N_VOCAB}")
    cfg = ModelConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=max_t, vocab_size=padded)
    shapes = {name: tuple(t.shape) for name, t in _shapes(cfg).items()}
    width = 2 if header[1] == MODEL_VERSION_BF16 else 4
    need = 4 * HEADER_INTS + width * sum(int(np.prod(s)) for s in shapes.values())
    if len(raw) != need:
        raise WeightsError(f"{path} holds {len(raw):,} bytes, its header says {need:,}: the file is truncated "
                           "or damaged; write or download it again")
    out, offset = {}, 4 * HEADER_INTS
    for name in tensor_order(n_layer):
        count = int(np.prod(shapes[name]))
        chunk = raw[offset:offset + width * count]
        offset += width * count
        if width == 4:
            tensor = torch.frombuffer(bytearray(chunk), dtype=torch.float32)
        else:
            tensor = torch.frombuffer(bytearray(chunk), dtype=torch.bfloat16).to(torch.float32)
        out[name] = tensor.reshape(shapes[name])
    return cfg, out


def _shapes(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Every stored tensor of a model of `cfg`'s shape, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = GPT(cfg)
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
