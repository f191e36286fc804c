"""bench.train_step's `--record`: one JSON object per run with exactly the
agreed keys, appended to a JSON-lines file (gpt2.report.figures_on_record, which the
product reads); and the whole-iteration batches it times come through the
trainer's own loader."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from bench import records
from bench.step_data import synthetic_loader
from gpt2.process.distributed import DistEnv
from gpt2.report import figures_on_record

CPU = torch.device("cpu")
KEYS = {"date", "commit", "device", "torch", "bench", "micro_batch", "tok_s_eager", "tok_s_compiled",
        "compiled_over_eager", "mfu", "gpus"}


def test_records_have_exactly_the_agreed_keys_and_are_appended(tmp_path):
    path = tmp_path / "results.jsonl"
    both = records.train_step_record(CPU, 0, 8, tok_s_eager=1000.0, tok_s_compiled=1500.0, mfu=None)
    eager_only = records.train_step_record(CPU, 0, 8, tok_s_eager=1000.0, tok_s_compiled=None, mfu=None)
    figures_on_record.append(both, path)
    figures_on_record.append(eager_only, path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [both, eager_only]
    for row in lines:
        assert set(row) == KEYS and tuple(row) == records.TRAIN_STEP_KEYS
        assert row["bench"] == "train_step" and row["torch"] == torch.__version__ and row["device"] == "cpu"
    assert both["compiled_over_eager"] == both["tok_s_compiled"] / both["tok_s_eager"]
    assert eager_only["compiled_over_eager"] is None


def test_the_commit_is_the_checked_out_one():
    repo = Path(figures_on_record.__file__).parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert figures_on_record.commit().split("+")[0] == head
    assert figures_on_record.commit(Path("/")) == "unknown"


def test_benchmark_batches_come_through_the_trainers_loader(tmp_path):
    env = DistEnv(rank=1, local_rank=1, world_size=2, device=CPU)
    loader = synthetic_loader(tmp_path, seq_len=16, micro_batch=2, accum=3, env=env)
    first = loader.next_batches()
    assert len(first) == 3 and all(x.shape == y.shape == (2, 16) for x, y in first)
    assert all(torch.equal(x[:, 1:], y[:, :-1]) for x, y in first)  # targets are the inputs shifted by one
    # Written once: a second loader over the same directory reads the same tokens.
    again = synthetic_loader(tmp_path, seq_len=16, micro_batch=2, accum=3, env=env).next_batches()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again))


def test_a_tree_without_its_git_names_its_commit_through_the_environment(monkeypatch):
    monkeypatch.setenv("BENCH_COMMIT", "0123abcd")
    assert figures_on_record.commit() == "0123abcd"
    row = figures_on_record.figures_record("resume_cuda", "NVIDIA H100 80GB HBM3", "2.11.0+cu130",
                                           {"exact_steps": 600})
    assert row["commit"] == "0123abcd" and tuple(row) == ("date", "commit", "device", "torch", "bench", "figures")
