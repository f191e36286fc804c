"""The preflight compiles what the trainer compiles before it saves the run's
compiled program (gpt2.train.compile_cache): the training step and the validation
pass (gpt2.train.step.warm_up). Saved without the latter, every attempt that
loads the preflight's program would compile its validation pass cold.

dynamo's `aot_eager` backend stands for inductor: which programs are compiled
when is dynamo's own (inductor's path: tests/gpt2/train/test_warm_restart.py)."""

from __future__ import annotations

import torch

from gpt2.preflight import steps
from gpt2.process.distributed import DistEnv
from gpt2.train import compile_cache
from tests.gpt2.train.fixtures import tiny_config

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def test_the_preflight_warms_up_as_the_trainer_does_before_it_saves_the_program(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, **{"runtime.compile": True, "train.micro_batch_size": 2})
    events = []
    real_compile, real_warm_up = torch.compile, steps.warm_up
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend="aot_eager", **kw))
    monkeypatch.setattr(steps, "warm_up", lambda *a: events.append("warm-up") or real_warm_up(*a))
    monkeypatch.setattr(compile_cache.Travel, "after_first_step", lambda self, *a: events.append("save"))
    out = steps.run_steps(config, CPU, 1)
    assert out.error is None and out.compiled and out.compile_cache == "absent"
    assert events == ["warm-up", "save"]
