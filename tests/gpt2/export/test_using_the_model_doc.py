"""docs/using-the-model.md: a command for every tool users take the export
to, linked from the README, and its transformers example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from gpt2.config.sections import ModelConfig
from gpt2.export.hf import write_hf_dir
from gpt2.model import GPT

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "using-the-model.md"
TOOLS = {"transformers": "pipeline(", "lm-eval": "lm_eval --model hf", "MLflow: load and serve": "mlflow models serve",
         "llama.cpp": "convert_hf_to_gguf.py", "llm.c": "./train_gpt2"}


def sections() -> dict[str, str]:
    parts = re.split(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_tool_has_its_command_and_the_readme_links_the_page():
    found = sections()
    for title, command in TOOLS.items():
        assert title in found, f"no section {title!r}"
        blocks = re.findall(r"```\w*\n(.*?)```", found[title], flags=re.S)
        assert any(command in b for b in blocks), f"section {title!r} has no code block with {command!r}"
    assert "](docs/using-the-model.md)" in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_transformers_example_runs_as_written(tmp_path, monkeypatch, capsys):
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=50304)
    torch.manual_seed(0)
    monkeypatch.setenv("HF_DIR", str(write_hf_dir(GPT(cfg).state_dict(), cfg, tmp_path / "hf")))
    (example,) = re.findall(r"```python\n(.*?)```", sections()["transformers"], flags=re.S)
    exec(compile(example, str(DOC), "exec"), {})
    printed = capsys.readouterr().out
    assert printed.count("The meaning of life is") == 2
