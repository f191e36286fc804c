"""The llm.c model file (`gpt2_124M.bin` in llm.c) and its tokenizer file.

Model: a header of 256 int32 — magic 20240326, version 3 (fp32, padded
vocabulary), max sequence length, vocabulary size 50257, layers, heads,
channels, padded vocabulary size — then every parameter as fp32 in llm.c's
order: wte (Vp, C), wpe (maxT, C), then for each kind of tensor the tensors of
all layers in turn (ln_1 w/b, c_attn w/b, attn c_proj w/b, ln_2 w/b, c_fc w/b,
mlp c_proj w/b), then ln_f w/b. Weights keep nn.Linear's (out, in) layout, as
llm.c's PyTorch reference writes them; the head is tied to wte and not stored.

Tokenizer (`gpt2_tokenizer.bin`): magic 20240328, version 2, vocabulary size,
EOT id; then each token as a length byte and its bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from gpt2.config.sections import ModelConfig
from gpt2.export.hf import clean_state_dict
from gpt2.tokenizer import EOT_TOKEN, N_VOCAB, get_encoding

MODEL_MAGIC = 20240326
MODEL_VERSION_FP32 = 3
TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2
HEADER_INTS = 256

# Per-layer tensors in file order; each is written for layer 0..L-1 before the next.
LAYER_TENSORS = (
    "ln_1.weight", "ln_1.bias",
    "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias",
)


def tensor_order(n_layer: int) -> list[str]:
    """Parameter names in the order llm.c reads them."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    names += [f"transformer.h.{i}.{t}" for t in LAYER_TENSORS for i in range(n_layer)]
    return names + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def model_header(cfg: ModelConfig) -> np.ndarray:
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:8] = [MODEL_MAGIC, MODEL_VERSION_FP32, cfg.block_size, N_VOCAB,
                  cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size]
    return header


def _write_fp32(tensor: torch.Tensor, f: BinaryIO) -> None:
    f.write(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())


def write_model_bin(state: dict[str, torch.Tensor], cfg: ModelConfig, path: Path) -> Path:
    """Write the llm.c fp32 model file; the embedding keeps our padded rows
    (llm.c reads Vp rows and only ever uses the first V)."""
    state = clean_state_dict(state)
    wte = state["transformer.wte.weight"]
    if wte.shape != (cfg.vocab_size, cfg.n_embd):
        raise ValueError(f"wte has shape {tuple(wte.shape)}, expected {(cfg.vocab_size, cfg.n_embd)}")
    with open(path, "wb") as f:
        f.write(model_header(cfg).tobytes())
        for name in tensor_order(cfg.n_layer):
            _write_fp32(state[name], f)
    return path


def write_tokenizer_bin(path: Path) -> Path:
    enc = get_encoding("gpt2")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:4] = [TOKENIZER_MAGIC, TOKENIZER_VERSION, N_VOCAB, EOT_TOKEN]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for token in range(N_VOCAB):
            raw = enc.decode_single_token_bytes(token)
            f.write(struct.pack("<B", len(raw)) + raw)  # every GPT-2 token is < 256 bytes
    return path


def model_file_name(cfg: ModelConfig) -> str:
    """llm.c's naming: gpt2_124M.bin for the 124M model."""
    params = cfg.vocab_size * cfg.n_embd + cfg.block_size * cfg.n_embd + cfg.n_layer * (12 * cfg.n_embd**2 + 13 * cfg.n_embd) + 2 * cfg.n_embd
    return f"gpt2_{round(params / 1e6)}M.bin"
