"""runtime.nproc_per_node: `auto` is one process per GPU of the machine that
trains, resolved there; a smaller number is kept and warned about."""

from __future__ import annotations

import logging

import pytest
import torch

from gpt2.config.overrides import ConfigError
from gpt2.launch import torchrun as launch
from gpt2.process.distributed import resolve_nproc, visible_gpus
from tests.gpt2.train.fixtures import tiny_config


@pytest.mark.parametrize(("setting", "gpus", "expected"), [("auto", 0, 1), ("auto", 1, 1), ("auto", 8, 8),
                                                          (1, 0, 1), (2, 0, 2), (4, 4, 4)])
def test_auto_is_one_process_per_visible_gpu(setting, gpus, expected, caplog):
    assert resolve_nproc(setting, gpus) == expected
    assert "runtime.nproc_per_node" not in caplog.text


def test_fewer_processes_than_gpus_warns_naming_the_setting(caplog):
    with caplog.at_level(logging.WARNING, logger="gpt2.process.distributed"):
        assert resolve_nproc(2, 8) == 2
    assert "runtime.nproc_per_node=2" in caplog.text and "2 of the 8 visible GPUs" in caplog.text


@pytest.mark.parametrize(("device", "expected"), [("auto", 4), ("cuda", 4), ("cuda:1", 1), ("cpu", 0), ("mps", 0)])
def test_visible_gpus_follow_runtime_device(device, expected, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert visible_gpus(device) == expected


def test_no_gpu_means_one_process(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert visible_gpus("auto") == 0 and resolve_nproc("auto", visible_gpus("auto")) == 1


def test_the_config_defaults_to_auto_and_still_takes_numbers(tmp_path):
    assert tiny_config(tmp_path).runtime.nproc_per_node == "auto"
    assert tiny_config(tmp_path, **{"runtime.nproc_per_node": 2}).runtime.nproc_per_node == 2
    with pytest.raises(ConfigError):
        tiny_config(tmp_path, **{"runtime.nproc_per_node": 0})


def _launches(monkeypatch, gpus: int) -> list:
    """Stub both ways of training; record which one train_stage takes."""
    calls = []
    monkeypatch.setattr(launch, "visible_gpus", lambda device: gpus)
    monkeypatch.setattr(launch, "torchrun_train", lambda config, *a: calls.append(("torchrun", a[-1])))
    monkeypatch.setattr(launch, "train", lambda config, **kw: calls.append(("in-process", 1)))
    return calls


@pytest.mark.parametrize(("gpus", "expected"), [(0, ("in-process", 1)), (1, ("in-process", 1)), (8, ("torchrun", 8))])
def test_train_stage_resolves_auto_where_it_runs(gpus, expected, tmp_path, monkeypatch):
    calls = _launches(monkeypatch, gpus)
    launch.train_stage(tiny_config(tmp_path))
    assert calls == [expected]


def test_an_isolated_stage_passes_the_resolved_count_on(tmp_path, monkeypatch):
    calls = _launches(monkeypatch, 0)
    launch.train_stage(tiny_config(tmp_path), isolate=True)
    assert calls == [("torchrun", 1)]


def test_the_launcher_resolves_auto_when_not_told(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "visible_gpus", lambda device: 3)
    assert launch.nproc_per_node(tiny_config(tmp_path)) == 3
    assert launch.nproc_per_node(tiny_config(tmp_path, **{"runtime.nproc_per_node": 2})) == 2

