"""Reading the workers' progress back out of their log lines (torchrun mode)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpt2.train.launch import parse_step, torchrun_command


def _loop_line(caplog, **extra) -> str:
    """A progress line exactly as gpt2.train.loop formats it."""
    log = logging.getLogger("gpt2.train.loop")
    with caplog.at_level(logging.INFO, logger="gpt2.train.loop"):
        log.info("step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s%s", 12, 60, 7.12345, 1e-3, 0.8123,
                 15321.7, extra.get("tail", ""))
    return "2026-01-01 00:00:00 [rank 0] INFO gpt2.train.loop: " + caplog.records[-1].getMessage()


def test_progress_lines_parse(caplog):
    info = parse_step(_loop_line(caplog))
    assert (info.step, info.max_steps, info.tokens_per_second) == (12, 60, 15322.0)
    assert info.loss == pytest.approx(7.12345, abs=1e-4) and info.lr == pytest.approx(1e-3)
    assert info.mfu is None and info.val_loss is None and info.fraction == pytest.approx(0.2)
    info = parse_step(_loop_line(caplog, tail=" | mfu 41.5% | val 3.2810"))
    assert info.mfu == pytest.approx(0.415) and info.val_loss == pytest.approx(3.281)
    assert parse_step("INFO gpt2.train.loop: checkpoint file:///x written") is None


def test_torchrun_command_runs_the_trainer_module():
    cmd = torchrun_command(Path("run.json"), Path("r.json"), 8, "abc", {"stage": "train"})
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8"]
    assert cmd[5:9] == ["-m", "gpt2.train", "--config", "run.json"]
    assert cmd[-4:] == ["--parent-run-id", "abc", "--tag", "stage=train"]
