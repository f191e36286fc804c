"""A fine-tune through the whole pipeline, as a user runs it: `gpt2 run --preset smoke --set
train.init_from=DIR` from a Hugging Face GPT-2 directory (made here with transformers), every stage
on Prefect's temporary server; the weights copied once into the root; the rerun with the source
gone answered from the cache (the run's identity comes from the copy, the source is not read);
`gpt2 sample` on the export, the same text for the same seed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.stack.fixtures import clean_env
from tests.tiers import SCENARIO

pytestmark = SCENARIO  # its commands and trainers from the warm interpreter (tests/warm_python)

REPO = Path(__file__).resolve().parents[2]
SMOKE_HF = {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 64}  # the smoke preset's model


def _hf_dir(path: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=50257, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                               attn_pdrop=0.0, **SMOKE_HF)).save_pretrained(path)
    return path


def _gpt2(env: dict, cwd: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "cli.main", *args, "--json"], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, f"gpt2 {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fine_tune_runs_through_the_pipeline_is_cached_without_its_source_and_samples(tmp_path):
    from transformers import GPT2LMHeadModel

    from gpt2.root import storage

    source = _hf_dir(tmp_path / "openai-like")
    env = {**clean_env(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    run = ("run", "--preset", "smoke", "--set", f"train.init_from={source}", "--set", f"runtime.root={tmp_path / 'root'}",
           "--set", f"runtime.work_dir={tmp_path / 'work'}", "--set", "train.max_steps=4")
    first = _gpt2(env, tmp_path, *run)
    assert first["cached_stages"] == [] and first["final_val_loss"] > 0
    records = list((tmp_path / "root" / "weights").glob("*/weights.json"))
    assert len(records) == 1, records  # fetched once into the root, with its sha256
    record = json.loads(records[0].read_text())
    assert record["source"] == str(source) and len(record["sha256"]) == 64
    export = storage.local_path(first["hf_dir"])
    assert GPT2LMHeadModel.from_pretrained(export).config.vocab_size == 50257  # the weights' own rows

    shutil.rmtree(source)  # a preempted or repeated fine-tune never reads its source again
    again = _gpt2(env, tmp_path, *run)
    assert sorted(again["cached_stages"]) == ["data", "evaluate", "export", "train"], again["cached_stages"]
    assert again["checkpoint"] == first["checkpoint"]

    sample = ("sample", "--from", str(export), "--prompt", "Hello", "--max-new-tokens", "8", "--seed", "3")
    texts = [_gpt2(env, tmp_path, *sample)["samples"] for _ in range(2)]
    assert texts[0] == texts[1] and all(t.startswith("Hello") for t in texts[0])
