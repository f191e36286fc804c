"""The preflight as the training flow runs it: `python -m gpt2.preflight` in a
child process on the training machine, so the GPU memory and the compiled
program it used are the child's and go with it before the trainer starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.process.signals import terminate_with_parent


class PreflightFailed(UserError):
    """A preflight check found what stops the run: the message lists the failed
    checks with what to change. Not a preemption: never retried or rescheduled."""

    def __init__(self, message: str, result: dict[str, Any] | None = None):
        super().__init__(message)
        self.result = result
        """The preflight's JSON result (None: it ended without one)."""


IN_FLOW_STEPS = 2
"""Timed steps of the preflight before training (`gpt2 preflight` times 5): the second step is the
first at steady state (the optimizer's state exists from the first), so two give the peak and a
throughput figure; three more would only sharpen a figure the run itself measures minutes later,
at each start and restart of the run (a few seconds on a GPU, a tenth of a CPU smoke run)."""


def run_child(config: Config, log_line: Callable[[str], None]) -> dict[str, Any]:
    """The preflight of `config` in a child; its JSON result. Every line it
    prints goes to `log_line` as it comes. Raises PreflightFailed when a check
    failed (the result is on the exception as `.result`)."""
    with tempfile.TemporaryDirectory(prefix="gpt2-preflight-") as tmp:
        path = Path(tmp) / "run.json"
        path.write_text(json.dumps(config.model_dump(mode="json")))
        cmd = [sys.executable, "-m", "gpt2.preflight", "--config", str(path), "--json",
               "--steps", str(IN_FLOW_STEPS)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=terminate_with_parent)
        result, last = None, []
        try:
            for line in proc.stdout:
                line = line.rstrip()
                if line.startswith("{"):
                    try:
                        result = json.loads(line)
                        continue
                    except json.JSONDecodeError:
                        pass
                last = (last + [line])[-20:]
                log_line(line)
            code = proc.wait()
        except BaseException:  # SIGTERM's bridge, a cancellation: the child removes its probe and goes
            proc.terminate()
            proc.wait()
            raise
    if result is None:
        raise PreflightFailed(f"the preflight ended with exit code {code} and no result; its last lines:\n"
                              + "\n".join(last))
    if code != 0 or not result.get("ok"):
        failed = [f"{name}: {c['detail']}" for name, c in result["checks"].items() if c["status"] == "fail"]
        raise PreflightFailed("the preflight found what would stop this run on this machine (train.preflight=false "
                              "skips it): " + " | ".join(failed or [f"exit code {code}"]), result)
    return result
