"""The published GPT-2 124M figures the runs report draws as reference lines,
chosen by the data each run trained on (`gpt2 report`, the pipeline's picture).

A validation loss is only comparable on the same data, so each dataset brings
the figures published on it: FineWeb runs llm.c's, OpenWebText runs nanoGPT's;
a run on any other data gets no loss line, since none was published. HellaSwag
is one benchmark whatever the training data: its line is drawn for every run
scored on it, never beside a score on the built-in format sample (a few items
written to check the scorer). Each label names the figure's source and the data
it was measured on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    panel: str
    value: float
    """In the unit the panel's metric is logged in (acc_norm as a fraction)."""
    label: str
    """The legend entry: the number and where it was published."""


HELLASWAG_ITEMS = 10_042
"""Items of HellaSwag's validation split: the benchmark the published figure was measured on."""
CHANCE = 0.25
"""HellaSwag's chance level: one of four endings picked at random."""

# OpenAI's released GPT-2 124M scored by lm-eval's hellaswag task, 0-shot, on the validation
# split: the scorer the evaluate stage runs, and the one the in-loop scorer is proven to match.
HELLASWAG_GPT2 = Reference("hellaswag", 0.311, "OpenAI GPT-2 124M: 31.1% (HellaSwag validation, "
                           f"{HELLASWAG_ITEMS:,} items, 0-shot; lm-eval acc_norm)")

LOSS_REFERENCES: dict[str, tuple[Reference, ...]] = {
    # llm.c's GPT-2 124M run (github.com/karpathy/llm.c/discussions/481): 10B tokens of
    # FineWeb, loss on FineWeb's validation split. gpt2-124m trains on FineWeb-edu, whose
    # split is not FineWeb's, so there this line is a guide, not the same measurement.
    "fineweb": (Reference("val_loss", 3.28, "llm.c GPT-2 124M: 3.28 (FineWeb val, 10B tokens; llm.c #481)"),),
    # nanoGPT's README (github.com/karpathy/nanoGPT, "reproducing GPT-2" and "baselines"), on its
    # OpenWebText val split (data.val_split=nanogpt holds out the same documents): its 124M
    # run goes down to ~2.85; OpenAI's GPT-2 124M evaluated there gets 3.12 (domain gap).
    "openwebtext": (
        Reference("val_loss", 2.85, "nanoGPT GPT-2 124M: ~2.85 (OpenWebText val; nanoGPT README)"),
        Reference("val_loss", 3.12, "OpenAI GPT-2 124M: 3.12 (OpenWebText val; nanoGPT README baselines)"),
    ),
}

TRAIN_TOKENS = {"openwebtext": 9_035_582_198}
"""Train-split tokens published for a dataset: nanoGPT's prepare.py counts its
OpenWebText train.bin; the same documents with one <|endoftext|> each (before
rather than after) are the same count here. `gpt2 plan` assumes it for an epoch
before the data stage has run (17,234 steps of 524,288 tokens)."""

REFERENCES = (*LOSS_REFERENCES["fineweb"], HELLASWAG_GPT2)
"""What a FineWeb run is drawn against."""


def dataset_of(params: dict[str, str]) -> str | None:
    """The published dataset a run trained on, from its logged params
    (data.name, data.source): `fineweb` (FineWeb or FineWeb-edu),
    `openwebtext`, or None for any other data."""
    said = f"{params.get('data.name', '')} {params.get('data.source', '')}".lower().replace("-", "").replace("_", "")
    if "openwebtext" in said:
        return "openwebtext"
    if "fineweb" in said:
        return "fineweb"
    return None


def references_for(datasets: Iterable[str | None], hellaswag: bool = True) -> tuple[Reference, ...]:
    """The lines for runs on these datasets: each dataset's loss figures once,
    in the order the runs come, then HellaSwag's unless `hellaswag` is False
    (the figure has no panel of the benchmark: its runs scored the format sample)."""
    lines = [ref for name in dict.fromkeys(datasets) if name for ref in LOSS_REFERENCES.get(name, ())]
    return (*lines, HELLASWAG_GPT2) if hellaswag else tuple(lines)
