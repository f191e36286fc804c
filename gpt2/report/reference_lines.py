"""The published GPT-2 124M figures the runs report draws as reference lines,
chosen by the data each run trained on (`gpt2 report`, the pipeline's picture),
and GPT-2's published CORE for the size of each run's model.

A validation loss is only comparable on the same data, so each dataset brings
the figures published on it: FineWeb runs llm.c's, OpenWebText runs nanoGPT's;
a run on any other data gets no loss line, since none was published. HellaSwag
is one benchmark whatever the training data: its line is drawn for every run
scored on it, never beside a score on the built-in format sample (a few items
written to check the scorer). Each label names the figure's source and the data
it was measured on.
"""

from __future__ import annotations

import math
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

# OpenAI's released GPT-2 scored on CORE (DCLM's 22 in-context tasks, each centered on its random
# baseline, as nanochat computes it): nanochat's dev/LEADERBOARD.md, by size. gpt2.eval.core holds
# the numbers; importing that package (no torch at its root) keeps them in one place.
GPT2_SHAPES = {"124M": (12, 768), "355M": (24, 1024), "774M": (36, 1280), "1.5B": (48, 1600)}
"""Each GPT-2 size's (n_layer, n_embd): the model a run's CORE is set beside."""
CORE_SOURCE = "CORE, 22 tasks; nanochat dev/LEADERBOARD.md"


def core_reference(size: str) -> Reference:
    from gpt2.eval.core import GPT2_CORE

    return Reference("core", GPT2_CORE[size], f"OpenAI GPT-2 {size}: {GPT2_CORE[size]:.4f} ({CORE_SOURCE})")


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


def gpt2_size(params: dict[str, str]) -> str | None:
    """The GPT-2 size a run's model is set beside on CORE, from its logged params (model.n_layer,
    model.n_embd): the size of its shape, else the nearest by the weights of its blocks (12·L·d²;
    a model smaller than 124M, as smoke's, is set beside 124M); None without those params."""
    try:
        layers, width = int(params["model.n_layer"]), int(params["model.n_embd"])
    except (KeyError, ValueError):
        return None
    def distance(size: str) -> tuple[bool, float]:
        n_layer, n_embd = GPT2_SHAPES[size]
        return (n_layer, n_embd) != (layers, width), abs(math.log(n_layer * n_embd ** 2 / (layers * width ** 2)))

    return min(GPT2_SHAPES, key=distance)


def references_for(datasets: Iterable[str | None], hellaswag: bool = True,
                   core_sizes: Iterable[str] = ()) -> tuple[Reference, ...]:
    """The lines for runs on these datasets: each dataset's loss figures once,
    in the order the runs come, then HellaSwag's unless `hellaswag` is False
    (the figure has no panel of the benchmark: its runs scored the format sample),
    then GPT-2's CORE for each size of the runs drawn on the CORE panel."""
    lines = [ref for name in dict.fromkeys(datasets) if name for ref in LOSS_REFERENCES.get(name, ())]
    core = [core_reference(size) for size in dict.fromkeys(core_sizes)]
    return (*lines, *([HELLASWAG_GPT2] if hellaswag else []), *core)
