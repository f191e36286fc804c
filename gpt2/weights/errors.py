"""What the weights' readers and the pipeline's parent share without importing torch:
the parent flow only checks and pins the fetched copy (gpt2.weights.init), and a
flow-run process that never loads a tensor should not pay torch's import."""

from __future__ import annotations

from gpt2.errors import UserError

PADDED_VOCAB = 50304
"""GPT-2's vocabulary padded to a multiple of 128, as the presets' model.vocab_size (llm.c's Vp)."""


class WeightsError(UserError, ValueError):
    """Weights that cannot be loaded into this project's GPT-2: one line naming the file and what is wrong."""
