"""`train.init_from`: the weights a fine-tune starts from, fetched once into the root and
kept there as a data stage keeps its shards.

    <root>/weights/<name>-<source hash>/
      model.safetensors   our tensors (fp32), whatever format the source held
      weights.json        the source, the shape, the file's sha256 and size: written last

The copy is in our own format, so its sha256 is the weights' content whatever file held them:
that sha256 (`train.init_sha256`) is what the run's identity counts (gpt2.config.identity). A
run resolves its config here before anything derives its name (`with_resolved_init`): the
first time the source is read and the copy written; every later start, a resumed one
included, reads only the record, and the trainer's first start reads the copy, verified
against it. The model's shape comes from the weights: a model.* that disagrees is refused.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from typing import TYPE_CHECKING

from gpt2.config.sections import ModelConfig
from gpt2.config.train import SCRATCH
from gpt2.config.tree import Config
from gpt2.root import layout, storage
from gpt2.tokenizer import N_VOCAB
from gpt2.weights.errors import PADDED_VOCAB, WeightsError

if TYPE_CHECKING:
    import torch

WEIGHTS_FILE, RECORD = "model.safetensors", "weights.json"
SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def cache_dir(config: Config) -> str:
    return layout.init_weights_dir(layout.root(config), config.train.init_from)


def fetch(config: Config) -> dict:
    """The record of train.init_from's copy in the root, written (source read once) if there is none."""
    directory = cache_dir(config)
    record = storage.read_record(storage.join(directory, RECORD))
    if record is not None:
        return record
    from safetensors.torch import save_file

    from gpt2.weights.source import load_source  # torch: only where weights are read

    shape, tensors = load_source(config.train.init_from)
    with tempfile.TemporaryDirectory(prefix="gpt2-init-") as tmp:
        path = Path(tmp) / WEIGHTS_FILE
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        data = path.read_bytes()
        storage.put_file_atomic(path, storage.join(directory, WEIGHTS_FILE))
    record = {"source": config.train.init_from, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
              "model": shape.model_dump(mode="json")}
    storage.write_record(storage.join(directory, RECORD), record)
    return record


def fetched(config: Config) -> bool:
    """train.init_from's weights are in the root already (a start reads them from there)."""
    return storage.read_record(storage.join(cache_dir(config), RECORD)) is not None


def init_problem(config: Config) -> str | None:
    """A local train.init_from that does not exist and was never fetched into the root, said in
    a command's first second (before a pipeline's data stage runs for nothing); a URL is left
    to the fetch, which names it if it does not answer."""
    source = config.train.init_from
    local = storage.local_path(storage.normalize_url(source)) if source != SCRATCH else None
    if local is None or local.exists() or storage.exists(storage.join(cache_dir(config), RECORD)):
        return None
    return (f"train.init_from={source}: {local} does not exist; give a Hugging Face GPT-2 directory, an llm.c "
            "model .bin or a run's checkpoint (a local path or a URL), or scratch")


def _describe(model: ModelConfig) -> str:
    return ", ".join(f"{f}={getattr(model, f)}" for f in SHAPE_FIELDS)


def model_shape(model: ModelConfig, weights: ModelConfig, source: str) -> ModelConfig:
    """The model a run of `model` builds to start from `weights`; WeightsError naming both
    shapes where they disagree. A shorter context than the weights' is nanoGPT's crop (the
    first positions kept, `init_weights`); 50257 and 50304 are one vocabulary, padded or not."""
    wrong = [f for f in ("n_layer", "n_head", "n_embd") if getattr(model, f) != getattr(weights, f)]
    wrong += ["block_size"] if model.block_size > weights.block_size else []
    gpt2_vocab = {model.vocab_size, weights.vocab_size} <= {N_VOCAB, PADDED_VOCAB}
    wrong += ["vocab_size"] if model.vocab_size != weights.vocab_size and not gpt2_vocab else []
    if wrong:
        raise WeightsError(
            f"the weights of train.init_from={source} have the shape {_describe(weights)}, the config asks for "
            f"{_describe(model)} ({', '.join('model.' + f for f in wrong)} disagree): the model's shape comes from "
            "its weights; drop those model.* settings or set them to the weights' (a smaller model.block_size is fine)")
    # The weights' own rows, not the preset's: GPT-2's 50257 padded with rows that never trained would
    # take part in our softmax (over every row) and the loss would no longer be GPT-2's (see
    # gpt2.weights.source.without_untrained_padding); a run's trained padding is kept as it trained.
    return model.model_copy(update={"vocab_size": weights.vocab_size})


def with_resolved_init(config: Config, fetching: bool = True, required: bool = True) -> Config:
    """The config a fine-tune runs: train.init_sha256 the copy's, model.vocab_size the weights'.
    `fetching=False`: for stages that only read a run (evaluate, export, sample), which never
    fetch: weights not fetched yet mean the run has not started (with `required=False`, for a
    named checkpoint that needs no run name, the config is left as it is)."""
    train = config.train
    if train.init_from == SCRATCH:
        return config
    directory = cache_dir(config)
    record = fetch(config) if fetching else storage.read_record(storage.join(directory, RECORD))
    if record is None and not required:
        return config
    if record is None:
        raise WeightsError(f"train.init_from={train.init_from} has not been fetched into {directory}: no run has "
                           "started from it under this root yet; train it first (gpt2 train or gpt2 run)")
    if train.init_sha256 and train.init_sha256 != record["sha256"]:
        raise WeightsError(f"{storage.join(directory, WEIGHTS_FILE)} holds weights of sha256 {record['sha256']}, "
                           f"train.init_sha256 asks for {train.init_sha256}: drop train.init_sha256 to start from "
                           f"these, or delete {directory} to fetch {train.init_from} again")
    model = model_shape(config.model, ModelConfig.model_validate(record["model"]), train.init_from)
    train = train.model_copy(update={"init_sha256": record["sha256"]})
    return config.model_copy(update={"model": model, "train": train})


def init_weights(config: Config) -> dict[str, torch.Tensor]:
    """A resolved fine-tune's starting tensors, read from the root's copy (never the source),
    verified against its record; WeightsError naming the file when it does not match."""
    from safetensors.torch import load

    directory = cache_dir(config)
    url = storage.join(directory, WEIGHTS_FILE)
    expected = config.train.init_sha256 or with_resolved_init(config, fetching=False).train.init_sha256
    try:
        data = storage.read_bytes(url)
    except FileNotFoundError:
        raise WeightsError(f"{url} is missing: delete {directory} to fetch {config.train.init_from} again") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise WeightsError(f"{url} has sha256 {digest}, its record says {expected}: the copy is damaged; delete "
                           f"{directory} to fetch {config.train.init_from} again")
    tensors = load(data)
    # nanoGPT's crop_block_size: a shorter context keeps the first positions' embeddings.
    tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"][:config.model.block_size].clone()
    return tensors
