"""A source of weights, as `gpt2 sample --from` and `train.init_from` name it: a
local path or any fsspec URL of

- a Hugging Face GPT-2 directory (config.json beside model.safetensors or pytorch_model.bin:
  `hf://openai-community/gpt2` where the hub is reachable, our own export's `.../export/.../hf`);
- llm.c's model `.bin` (llm.c's gpt2_124M.bin, our export's `.../llmc/gpt2_*.bin`);
- a checkpoint of one of our runs (`runs/<run>/checkpoints/step_N`, verified against its marker).

The model's shape comes from the weights themselves.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from gpt2.checkpoint.catalog import MARKER
from gpt2.checkpoint.store import load_model, load_weights
from gpt2.config.sections import ModelConfig
from gpt2.errors import UserError
from gpt2.model import GPT
from gpt2.root import storage
from gpt2.tokenizer import N_VOCAB
from gpt2.weights.readers import WeightsError, load_hf_dir, load_llmc_bin

HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
"""A Hugging Face directory's weights, in the order they are read: the first that exists."""


def _local(url: str, into: Path) -> Path:
    """A remote Hugging Face directory's config.json and its first weights file, copied into
    `into` (a local path stays where it is). Only the first: the hub's openai-community/gpt2
    holds both files, and the second would be another 500 MB read for nothing."""
    path = storage.local_path(url)
    if path is not None:
        return path
    storage.get_file(storage.join(url, "config.json"), into / "config.json")
    for name in HF_WEIGHTS:
        remote = storage.join(url, name)
        if storage.exists(remote):
            storage.get_file(remote, into / name)
            break
    return into


def load_source(source: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(the shape, our tensors) of whatever `source` holds; WeightsError naming it otherwise."""
    return without_untrained_padding(*_read(source))


def without_untrained_padding(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict]:
    """Vocabulary rows past GPT-2's 50257 that are all zero are padding that never trained
    (llm.c's gpt2_124M.bin pads OpenAI's weights so): dropped. Our softmax runs over every
    row (llm.c's only over the first 50257), so zero rows would give those tokens logit 0,
    far above GPT-2's real ones, and the loss (and any sample) would no longer be GPT-2's.
    Trained padding (a run of ours at 50304) has learnt to stay low, and is kept."""
    wte = tensors["transformer.wte.weight"]
    if cfg.vocab_size <= N_VOCAB or torch.count_nonzero(wte[N_VOCAB:]):
        return cfg, tensors
    return cfg.model_copy(update={"vocab_size": N_VOCAB}), {**tensors, "transformer.wte.weight": wte[:N_VOCAB].clone()}


def _read(source: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    url = storage.normalize_url(source)
    try:
        if not storage.exists(url):
            raise WeightsError(f"{source} does not exist: give a Hugging Face GPT-2 directory, an llm.c model "
                               ".bin or a run's checkpoint (a local path or a URL)")
        if storage.exists(storage.join(url, MARKER)):
            model, config = load_model(url)
            return config.model, {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
        with tempfile.TemporaryDirectory(prefix="gpt2-weights-") as tmp:
            if url.endswith(".bin") and storage.exists(url):
                local = storage.local_path(url)
                if local is None:
                    local = Path(tmp) / "model.bin"
                    storage.get_file(url, local)
                return load_llmc_bin(local)
            if storage.exists(storage.join(url, "config.json")):
                return load_hf_dir(_local(url, Path(tmp)))
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the hub or a bucket that does not answer (OSError, httpx's
        # ConnectError, a client's own): named with the URL, as the data stage names its source
        raise WeightsError(f"{source} cannot be read ({type(err).__name__}: {str(err)[:200]}): check the URL, "
                           "the network and the credentials") from None
    raise WeightsError(f"{source} holds no weights this project reads: a Hugging Face GPT-2 directory "
                       "(config.json), an llm.c model .bin, or a checkpoint of a run (its COMPLETE marker)")


def model_from(source: str) -> GPT:
    """Our GPT with `source`'s weights (fp32, eval mode, on the CPU)."""
    cfg, tensors = load_source(source)
    model = GPT(cfg)
    load_weights(model, tensors)
    return model.eval()
