"""llama.cpp's own converter (convert_hf_to_gguf.py) on the smoke export: it
converts, and the GGUF holds our weights and our context length.

The converter is llama.cpp's Python script with its gguf-py beside it, taken
from $LLAMA_CPP_DIR (a llama.cpp checkout) or else from the llama.cpp tree
that PyPI's llama-cpp-python source release vendors (downloaded once into
the user's cache; end-to-end tier, as it needs the package index)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt2.config.sections import ModelConfig
from gpt2.export.hf import to_hf_state_dict, write_hf_dir
from gpt2.model import GPT

pytestmark = pytest.mark.e2e

LLAMA_CPP_PYTHON = "0.3.36"  # vendors a llama.cpp tree with conversion/ and gguf-py 0.19
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def converter_dir() -> Path:
    if os.environ.get("LLAMA_CPP_DIR"):
        return Path(os.environ["LLAMA_CPP_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpt2-pipeline-tests"
    tree = cache / f"llama.cpp-from-llama-cpp-python-{LLAMA_CPP_PYTHON}"
    if not (tree / "convert_hf_to_gguf.py").is_file():
        _extract_converter(cache, tree)
    return tree


def _extract_converter(cache: Path, tree: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    got = subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "--no-deps",
                          "--no-binary", ":all:", "-d", str(cache)], capture_output=True, text=True)
    sdist = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if got.returncode != 0 or not sdist.is_file():
        pytest.skip("llama.cpp's converter is not here (set LLAMA_CPP_DIR) and pip could not fetch it: "
                    f"{got.stderr[-300:]}")
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(tuple(prefix + p for p in CONVERTER_PARTS))]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(tree, members=members, filter="data")
    sdist.unlink()


def test_llama_cpps_converter_turns_the_export_into_a_gguf_of_our_weights(tmp_path):
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=50304)
    torch.manual_seed(0)
    state = GPT(cfg).state_dict()
    out = write_hf_dir(state, cfg, tmp_path / "hf")
    llama_cpp = converter_dir()
    gguf_path = tmp_path / "model-f32.gguf"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(out), "--outtype", "f32",
                           "--outfile", str(gguf_path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.remove(str(llama_cpp / "gguf-py"))
    reader = GGUFReader(gguf_path)
    fields = {name: reader.fields[name].contents() for name in
              ("general.architecture", "gpt2.context_length", "gpt2.block_count", "gpt2.embedding_length",
               "gpt2.attention.head_count", "tokenizer.ggml.model", "tokenizer.ggml.eos_token_id")}
    assert fields == {"general.architecture": "gpt2", "gpt2.context_length": 64, "gpt2.block_count": 2,
                      "gpt2.embedding_length": 64, "gpt2.attention.head_count": 2, "tokenizer.ggml.model": "gpt2",
                      "tokenizer.ggml.eos_token_id": 50256}
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    hf = to_hf_state_dict(state)
    np.testing.assert_array_equal(tensors["token_embd.weight"], hf["transformer.wte.weight"].numpy())
    np.testing.assert_array_equal(tensors["position_embd.weight"], hf["transformer.wpe.weight"].numpy())
    # HF keeps c_attn as Conv1D (in, out); llama.cpp stores it as (out, in), the transpose.
    qkv = hf["transformer.h.1.attn.c_attn.weight"]
    np.testing.assert_array_equal(tensors["blk.1.attn_qkv.weight"], qkv.t().numpy())
