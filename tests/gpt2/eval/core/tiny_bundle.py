"""A tiny CORE bundle in the bundle's own format (core.yaml, eval_meta_data.csv, eval_data/),
written by the tests: a few items of each task type, few-shot on one task, baselines not zero;
and the reference algorithm, written plainly: one item per forward pass through GPT.forward."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt2.tokenizer import N_VOCAB

ANIMALS = ["cat", "dog", "hippopotamus", "cow", "fish", "guinea pig", "sheep", "goat", "duck", "mouse"]
MC = [{"query": f"Question: which of these animals makes the sound {s}{' again' * (i % 2)}?\nAnswer:", "choices": ANIMALS[i % 7: i % 7 + 4], "gold": i % 4}
      for i, s in enumerate(["moo", "woof", "meow", "neigh", "quack", "baa", "tweet", "squeak", "blub", "oink"])]
SCHEMA = [{"context_options": [f"The {a} chased the {b} because the {a}", f"The {a} chased the {b} because the {b}"],
           "continuation": "was hungry.", "gold": i % 2}
          for i, (a, b) in enumerate(zip(ANIMALS, reversed(ANIMALS)))][:6]
LM = [{"context": f"One, two, three, four, five, six, seven.  The {a} is ", "continuation": f"a {a}"}
      for a in ANIMALS[:6]]

CORE_YAML = """icl_tasks:
- label: animal_mc
  dataset_uri: mc/animals.jsonl
  num_fewshot: [2]
  icl_task_type: multiple_choice
  continuation_delimiter: ' '
- label: animal_schema
  dataset_uri: schema.jsonl
  num_fewshot: [0]
  icl_task_type: schema
- label: animal_lm
  dataset_uri: lm.jsonl
  num_fewshot: [1]
  icl_task_type: language_modeling
"""
META = "Eval Task,Task Category,Random baseline\nanimal_mc,x,25.0\nanimal_schema,x,50\nanimal_lm,x,0\n"
FILES = {"mc/animals.jsonl": MC, "schema.jsonl": SCHEMA, "lm.jsonl": LM}


def write_bundle(directory: Path, files: dict | None = None, core_yaml: str = CORE_YAML, meta: str = META) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "core.yaml").write_text(core_yaml)
    (directory / "eval_meta_data.csv").write_text(meta)
    for rel, items in (FILES if files is None else files).items():
        path = directory / "eval_data" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return directory


def zip_bundle(directory: Path, out: Path) -> Path:
    """As nanochat ships it: everything inside one eval_bundle/ folder."""
    with zipfile.ZipFile(out, "w") as z:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                z.write(path, f"eval_bundle/{path.relative_to(directory)}")
    return out


# --- the reference: one item per forward pass -----------------------------------------------


def render(kind: str, item: dict, shots: list[dict], d: str) -> list[str]:
    """nanochat's templates, spelled out."""
    if kind == "multiple_choice":
        head = "".join(s["query"] + d + s["choices"][s["gold"]] + "\n\n" for s in shots)
        return [head + item["query"] + d + c for c in item["choices"]]
    if kind == "schema":
        head = "".join(s["context_options"][s["gold"]] + d + s["continuation"] + "\n\n" for s in shots)
        return [head + c + d + item["continuation"] for c in item["context_options"]]
    head = "".join(s["context"].strip() + d + s["continuation"] + "\n\n" for s in shots)
    return [(head + item["context"].strip() + d).strip(), head + item["context"].strip() + d + item["continuation"]]


def reference_correct(model, enc, kind: str, items: list[dict], shots: int, d: str, max_per_task=None,
                      seen: list | None = None) -> list[bool]:
    """Right or wrong per item; `seen` collects each item's (token rows, continuation starts)."""
    data = list(items)
    random.Random(1337).shuffle(data)
    data = data[:max_per_task] if max_per_task else data
    out = []
    for idx, item in enumerate(data):
        few = []
        if shots:
            few = [data[i] for i in random.Random(1234 + idx).sample([i for i in range(len(data)) if i != idx], shots)]
        tokens = [[50256] + enc.encode(p, allowed_special="all") for p in render(kind, item, few, d)]
        if kind == "multiple_choice":
            n = 0
            while all(len(t) > n and t[n] == tokens[0][n] for t in tokens):
                n += 1
            starts, ends = [n] * len(tokens), [len(t) for t in tokens]
        elif kind == "schema":
            n = 0
            while all(len(t) > n and t[-1 - n] == tokens[0][-1 - n] for t in tokens):
                n += 1
            starts, ends = [len(t) - n for t in tokens], [len(t) for t in tokens]
        else:
            starts, ends, tokens = [len(tokens[0])], [len(tokens[1])], [tokens[1]]
        T = model.config.block_size
        for k, t in enumerate(tokens):
            if len(t) > T:
                cut = len(t) - T
                tokens[k], starts[k], ends[k] = t[cut:], starts[k] - cut, ends[k] - cut
        if seen is not None:
            seen.append((tokens, starts))
        width = max(map(len, tokens))
        ids = torch.full((len(tokens), width), 50256)
        for k, t in enumerate(tokens):
            ids[k, :len(t)] = torch.tensor(t)
        with torch.no_grad():
            logits = model(ids)[0][:, :, :N_VOCAB].float()
        losses = F.cross_entropy(logits[:, :-1].reshape(-1, N_VOCAB), ids[:, 1:].reshape(-1),
                                 reduction="none").view(len(tokens), -1)
        if kind == "language_modeling":
            s, e = starts[0], ends[0]
            out.append(bool(torch.all(logits[0, s - 1:e - 1].argmax(-1) == ids[0, s:e])))
        else:
            means = [losses[k, s - 1:e - 1].mean().item() for k, (s, e) in enumerate(zip(starts, ends))]
            out.append(means.index(min(means)) == item["gold"])
    return out
