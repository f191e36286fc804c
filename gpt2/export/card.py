"""The model card: what an exported model is, in the words a user reads first.

The same text is the HF directory's README.md (with the metadata block the
Hugging Face hub reads) and the registered MLflow version's description. It
says the architecture, the data and the tokens trained, the final validation
loss, HellaSwag (and whether that was the benchmark or the built-in format
sample), the command that trains it again and the code that wrote it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from gpt2.config.identity import fingerprint
from gpt2.config.presets import PRESETS
from gpt2.config.train import SCRATCH
from gpt2.config.tree import Config
from gpt2.tokenizer import N_VOCAB

# The sections whose settings make the weights and the HellaSwag figure.
COMMAND_SECTIONS = ("model", "data", "train", "eval")


@dataclass(frozen=True)
class CardFacts:
    config: Config
    """The config the checkpoint was trained with (its state.json)."""
    step: int
    state: dict[str, Any]
    """The checkpoint's state.json: val_loss, tokens_seen, ..."""
    hellaswag: dict[str, Any] | None
    """The evaluate stage's result for this checkpoint, if it ran."""
    code_version: str

    def eval_id(self) -> str | None:
        """What of the card can change for the same weights: a later evaluation."""
        return None if self.hellaswag is None else fingerprint(self.hellaswag["hellaswag"])


def code_version() -> str:
    """The package version, and the commit when it runs from a git checkout
    (`+dirty` when tracked files differ from it)."""
    try:
        release = version("gpt2-pipeline")
    except PackageNotFoundError:
        release = "dev"
    here = Path(__file__).parent
    try:
        head = _git(here, "rev-parse", "HEAD")
        dirty = _git(here, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return release
    return f"{release} (commit {head}{'+dirty' if dirty else ''})"


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=10)
    return done.stdout.strip()


def reproduce_command(config: Config) -> str:
    """`gpt2 run` with the preset and every setting that differs from it in the
    sections that make the weights and the evaluation."""
    base = PRESETS[config.preset]().model_dump(mode="json") if config.preset in PRESETS else {}
    sets = [f"--set {key}={value}" for key, value in _leaves(config.model_dump(mode="json"), base)]
    return " ".join(["gpt2 run", f"--preset {config.preset}", *sets])


def _leaves(tree: dict, base: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in tree.items():
        if not prefix and key not in COMMAND_SECTIONS:
            continue
        if isinstance(value, dict):
            out += _leaves(value, base.get(key, {}), f"{prefix}{key}.")
        elif base.get(key, object()) != value:
            out.append((f"{prefix}{key}", "null" if value is None else value))
    return out


def architecture(config: Config) -> str:
    m = config.model
    padded = f"; trained padded to {m.vocab_size}" if m.vocab_size > N_VOCAB else ""
    return (f"GPT-2 (decoder-only transformer, Hugging Face `GPT2LMHeadModel`): {m.n_layer} layers, {m.n_head} heads, "
            f"{m.n_embd} channels, {m.block_size} positions, vocabulary 50,257 (GPT-2's BPE{padded}), tied input and "
            "output embeddings, GELU (tanh), LayerNorm eps 1e-5")


def origin(config: Config) -> str:
    """From scratch, or fine-tuned from which weights (train.init_from, their sha256)."""
    t = config.train
    if t.init_from == SCRATCH:
        return f"GPT-2 trained from scratch by gpt2-pipeline (preset `{config.preset}`)"
    sha = f" (sha256 {t.init_sha256})" if t.init_sha256 else ""
    return f"GPT-2 fine-tuned by gpt2-pipeline (preset `{config.preset}`) from the weights of `{t.init_from}`{sha}"


def training(facts: CardFacts) -> str:
    d, tokens = facts.config.data, facts.state.get("tokens_seen")
    seen = f"{tokens:,} tokens" if isinstance(tokens, int) else "an unrecorded number of tokens"
    return f"{seen} of `{d.source}` (dataset `{d.name}`) in {facts.step:,} steps"


def val_loss(state: dict[str, Any]) -> str:
    loss = state.get("val_loss")
    if loss is None:
        return "not measured (no validation pass before this checkpoint)"
    at = state.get("val_loss_step")
    return f"{loss:.4f}" + (f" (at step {at:,})" if at is not None else "")


def hellaswag(result: dict[str, Any] | None) -> str:
    if result is None:
        return "not evaluated yet (`gpt2 evaluate` with the same preset and --set options)"
    h = result["hellaswag"]
    if h is None:  # an evaluation of other tasks only (eval.tasks without hellaswag)
        return "not evaluated (the last evaluation's eval.tasks left it out)"
    score = f"acc_norm {h['acc_norm']:.4f}, acc {h['acc']:.4f} on {h['n']:,} items"
    if result.get("benchmark"):
        return f"{score} of the HellaSwag validation set (lm-eval's `hellaswag` task)"
    return (f"{score} of `{result['source']}`: the built-in format sample, NOT the benchmark; "
            "its figure checks the evaluation runs, it says nothing of the model")


def card_body(facts: CardFacts) -> str:
    """The card without its metadata block (the MLflow version's description)."""
    c = facts.config
    return "\n".join([
        f"# {c.export.registered_model}",
        "",
        f"{origin(c)}, checkpoint at step {facts.step:,}.",
        "",
        f"- **Architecture**: {architecture(c)}.",
        f"- **Training data**: {training(facts)}.",
        f"- **Final validation loss**: {val_loss(facts.state)}.",
        f"- **HellaSwag**: {hellaswag(facts.hellaswag)}.",
        f"- **Reproduce**: `{reproduce_command(c)}`",
        f"- **Code version**: gpt2-pipeline {facts.code_version}.",
        "",
        "Loads in `transformers` and `lm-eval --model hf`; converts with llama.cpp's `convert_hf_to_gguf.py`. "
        "The llm.c model file sits beside this directory (`../llmc/`).",
        "",
    ])


def model_card(facts: CardFacts) -> str:
    """README.md of the HF directory: the hub's metadata block, then the card."""
    meta = ["---", "library_name: transformers", "pipeline_tag: text-generation", "tags:", "- gpt2",
            "- gpt2-pipeline", "---", ""]
    return "\n".join(meta) + card_body(facts)
