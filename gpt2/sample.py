"""Text from a model: continuations of a prompt, reproducible for a seed (`gpt2 sample`, and the
samples a training run logs every train.sample_every steps).

    gpt2 sample --from runs/<run>/export/step_000020/hf --prompt "Hello" --top-k 1
"""

from __future__ import annotations

import torch

from gpt2.model import GPT
from gpt2.tokenizer import EOT_TOKEN, get_encoding

SAMPLE_PROMPT = "Hello, I'm a language model,"


@torch.no_grad()
def text_samples(model: GPT, device: torch.device, seed: int, num: int = 4, max_new_tokens: int = 32,
                 prompt: str = SAMPLE_PROMPT, temperature: float = 1.0, top_k: int | None = 50) -> list[str]:
    """`num` continuations of `prompt` (each returned with the prompt before it), reproducible for
    a given seed; `top_k=1` is greedy. A private generator keeps the global RNG (and so training)
    untouched. An empty prompt starts from the end-of-text token, as a document does."""
    enc = get_encoding("gpt2")
    tokens = enc.encode(prompt, allowed_special="all") or [EOT_TOKEN]
    ids = torch.tensor(tokens, dtype=torch.long, device=device).repeat(num, 1)
    gen = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    out = model.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen)
    model.train(was_training)
    start = 0 if prompt else 1  # the end-of-text token an empty prompt started from is not text
    return [enc.decode(row[start:].tolist()) for row in out]
