"""runtime.compile: what `auto` means, and a compiled run end to end on CPU
(inductor's C++ backend), resumed from its own checkpoint."""

from __future__ import annotations

import shutil

import pytest
import torch

from gpt2.checkpoint import store
from gpt2.root import storage
from gpt2.train import compile_choice, session
from gpt2.train.run import train
from tests.gpt2.train.fixtures import tiny_config, write_dataset


@pytest.mark.parametrize(("setting", "device", "expected"), [
    ("auto", "cuda", True), ("auto", "cpu", False), ("auto", "mps", False),
    (True, "cpu", True), (False, "cuda", False),
])
def test_auto_compiles_on_cuda_only(setting, device, expected):
    assert compile_choice.resolve_compile(setting, torch.device(device)) is expected


def test_auto_on_cpu_keeps_the_eager_model(tmp_path):
    config = tiny_config(tmp_path)  # runtime.compile defaults to auto
    assert config.runtime.compile == "auto"
    raw = torch.nn.Linear(2, 2)
    assert compile_choice.compiled(raw, config, torch.device("cpu")) is raw


def test_the_probe_runs_eagerly_and_the_model_is_compiled_once_with_static_shapes(tmp_path, monkeypatch):
    """With micro_batch_size=auto the probe tries several sizes: compiled, each
    would be a recompilation, so it gets the eager model and compile comes after."""
    config = tiny_config(tmp_path, **{"runtime.compile": True, "train.micro_batch_size": "auto",
                                      "train.max_steps": 1, "tracking.enabled": False})
    write_dataset(config)
    calls = []
    probed = []
    real_find = session.find_micro_batch
    monkeypatch.setattr(session.torch, "compile", lambda model, **kw: calls.append((model, kw)) or model)
    monkeypatch.setattr(session, "find_micro_batch",
                        lambda model, *a: probed.append((model, len(calls))) or real_find(model, *a))
    train(config)
    [(model, kwargs)] = calls
    assert kwargs == {"dynamic": False}
    assert probed == [(model, 0)]  # the raw model, before any compilation


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor's CPU backend needs a C++ compiler")
# On a fresh machine (CI's) inductor's cache is empty and g++ builds each kernel: seen at 90 s and
# past it on a 2-core machine under the tier's load, against ~20 s once the cache holds them.
@pytest.mark.timeout(240)
def test_a_compiled_run_matches_eager_and_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    import torch._inductor.config

    # Kernels this small compile faster in-process than the worker pool starts.
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)
    compiled_run = {"runtime.compile": True, "train.max_steps": 4}
    config = tiny_config(tmp_path / "compiled", **compiled_run)
    write_dataset(config)
    first = train(config)
    assert first.steps == 4 and first.warmup_s is not None and first.warmup_s > 0
    eager = tiny_config(tmp_path / "eager", **{**compiled_run, "runtime.compile": False, "tracking.enabled": False})
    write_dataset(eager)
    assert first.final_val_loss == pytest.approx(train(eager).final_val_loss, abs=1e-3)

    shutil.rmtree(storage.local_path(store.latest_checkpoint(config)))  # as if killed after step 2's checkpoint
    resumed = train(config)
    assert resumed.resumed_from_step == 2 and resumed.steps == 4 and resumed.warmup_s is not None
    assert resumed.mlflow_run_id == first.mlflow_run_id
    assert resumed.final_val_loss == pytest.approx(first.final_val_loss, abs=1e-5)
