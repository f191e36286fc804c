"""Run the training stage on this machine: in-process on one device, or as
`torchrun --nproc_per_node=N -m gpt2.train` for several GPUs, with the
workers' log lines handed to the caller as they come (the Prefect flow
streams them into its own logger) and their progress parsed back out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

from gpt2.config import Config
from gpt2.train.progress import Progress, StepInfo
from gpt2.train.run import Preempted, TrainResult, train
from gpt2.train.session import TrainingError

log = logging.getLogger(__name__)

# The loop's progress line: "step 12/60 | loss 7.1234 | lr 1.00e-03 | norm 0.812 | 1500 tok/s[ | mfu 41.0%]"
STEP_LINE = re.compile(
    r"step (\d+)/(\d+) \| loss (\S+) \| lr (\S+) \| norm (\S+) \| (\d+) tok/s(?: \| mfu ([\d.]+)%)?(?: \| val (\S+))?"
)


def parse_step(line: str) -> StepInfo | None:
    m = STEP_LINE.search(line)
    if not m:
        return None
    step, total, loss, lr, norm, tps, util, val = m.groups()
    return StepInfo(step=int(step), max_steps=int(total), loss=float(loss), lr=float(lr), grad_norm=float(norm),
                    tokens_per_second=float(tps), mfu=float(util) / 100 if util else None, eta_seconds=None,
                    val_loss=float(val) if val else None)


def torchrun_command(config_path: Path, result_path: Path, nproc: int, parent_run_id: str | None,
                     tags: dict | None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "gpt2.train", "--config", str(config_path), "--result", str(result_path)]
    if parent_run_id:
        cmd += ["--parent-run-id", parent_run_id]
    for key, value in (tags or {}).items():
        cmd += ["--tag", f"{key}={value}"]
    return cmd


@contextlib.contextmanager
def forward_sigterm(proc: subprocess.Popen) -> Iterator[None]:
    """A SIGTERM to us (preemption) goes to torchrun, which passes it to the
    workers: they checkpoint and exit, and we report Preempted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def torchrun_train(config: Config, progress: Progress | None = None, log_line: Callable[[str], None] | None = None,
                   parent_run_id: str | None = None, tags: dict | None = None) -> TrainResult:
    """`train` in `runtime.nproc_per_node` worker processes under torchrun."""
    emit = log_line or log.info
    with tempfile.TemporaryDirectory(prefix="gpt2-train-") as tmp:
        config_path, result_path = Path(tmp) / "run.json", Path(tmp) / "result.json"
        config_path.write_text(json.dumps(config.model_dump(mode="json")))
        cmd = torchrun_command(config_path, result_path, config.runtime.nproc_per_node, parent_run_id, tags)
        emit("starting: " + " ".join(cmd))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        tail: deque[str] = deque(maxlen=40)
        with forward_sigterm(proc):
            for line in proc.stdout:
                line = line.rstrip()
                tail.append(line)
                emit(line)
                info = parse_step(line)
                if info is not None and progress is not None:
                    progress(info)
            code = proc.wait()
        if code == 0 and result_path.exists():
            return TrainResult(**json.loads(result_path.read_text()))
    if any("stopped by SIGTERM" in line for line in tail):
        raise Preempted(f"torchrun workers stopped by SIGTERM (exit {code}); rerun to resume")
    errors = [line for line in tail if "ERROR" in line or "Error" in line] or list(tail)[-10:]
    raise TrainingError(f"torchrun exited with code {code}:\n" + "\n".join(errors[-10:]))


def train_stage(config: Config, progress: Progress | None = None, log_line: Callable[[str], None] | None = None,
                parent_run_id: str | None = None, tags: dict | None = None) -> TrainResult:
    """Train on one device in this process, or on several through torchrun."""
    if config.runtime.nproc_per_node > 1:
        return torchrun_train(config, progress, log_line, parent_run_id, tags)
    return train(config, progress=progress, parent_run_id=parent_run_id, tags=tags)
