"""Human-readable outputs of a training run: text samples and the loss curve."""

from __future__ import annotations

from pathlib import Path

import torch

from gpt2.model import GPT
from gpt2.tokenizer import get_encoding

SAMPLE_PROMPT = "Hello, I'm a language model,"


@torch.no_grad()
def text_samples(model: GPT, device: torch.device, seed: int, num: int = 4, max_new_tokens: int = 32,
                 prompt: str = SAMPLE_PROMPT) -> list[str]:
    """`num` continuations of `prompt`, reproducible for a given seed. A private
    generator keeps the global RNG (and so training) untouched."""
    enc = get_encoding("gpt2")
    ids = torch.tensor(enc.encode(prompt), dtype=torch.long, device=device).repeat(num, 1)
    gen = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    out = model.generate(ids, max_new_tokens, generator=gen)
    model.train(was_training)
    return [enc.decode(row.tolist()) for row in out]


def loss_curve_png(path: Path, train: list[list[float]], val: list[list[float]], title: str) -> Path:
    """Plot train loss per step and val loss at its steps into a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train loss", linewidth=1)
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="val loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
