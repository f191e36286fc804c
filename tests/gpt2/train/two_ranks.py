"""Two real gloo ranks for tests of what one rank's failure does to the other:
each rank runs a function (a real `train()` call) and writes what it ended
with; the pair runs in a subprocess bounded by a timeout, so a hang fails the
test instead of blocking it, and on a timeout the whole process group goes,
so no rank is left running."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[3]


def join_as(rank: int, port: int) -> None:
    """The environment torchrun would give rank `rank` of two on this machine."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def record_outcome(tmp: str | Path, rank: int, run: Callable[[], object]) -> None:
    """What this rank ended with, as {"rank", "result"} or {"rank", "error": "Type: message"}."""
    outcome: dict = {"rank": rank}
    try:
        outcome["result"] = run().to_dict()
    except Exception as err:  # noqa: BLE001 - what each rank ended with is the point
        outcome["error"] = f"{type(err).__name__}: {err}"
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(outcome))


def spawn(worker: Callable, *args) -> None:
    """Start `worker(rank, *args, port)` on two processes and wait for both."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(*args, port), nprocs=2)


def run_pair(call: str, tmp: Path, timeout: float, env: dict[str, str] | None = None) -> list[dict]:
    """Run `call` (Python code that spawns the pair) in a subprocess of its own
    process group; both ranks' outcomes. A timeout kills the group and fails."""
    proc = subprocess.Popen([sys.executable, "-c", call], cwd=REPO, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "WARM_PYTHON_C": "1", **(env or {})})
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"the two ranks were still running after {timeout:.0f} s: a hang") from None
    assert code == 0, f"the pair exited with code {code}"
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]
