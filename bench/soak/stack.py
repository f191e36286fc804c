"""The soak's local stack and its reference run (bench/soak/run.py): a stack of
its own (`gpt2 stack up` in an environment of its own, every process marked
so the faults find only the soak's), the soak's training config, the
uninterrupted reference it is compared with, and a small filesystem per
pipeline for the full-disk fault."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from bench.soak import checks, faults
from cli.stack import processes, services
from cli.stack.prefect_setup import isolated_env

PROJECT = Path(__file__).resolve().parents[2]

TRAIN = {"train.max_steps": 200, "train.checkpoint_every": 20, "train.eval_every": 10_000,
         "train.sample_every": 10_000, "train.total_batch_tokens": 256, "train.micro_batch_size": 2,
         "eval.every_steps": 0}
"""The soak's training: smoke-sized steps (two micro-batches: accumulation is
exercised), long enough for faults to land mid-training (~40 s of steps on two
cores), a periodic checkpoint every 20 steps so a SIGKILL redoes some."""

def _say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def soak_env(base: Path, mark: str) -> dict[str, str]:
    """The user's environment minus anything that points Prefect or MLflow
    elsewhere; the soak's own home and stack directory; the mark every
    process of the soak inherits (how the injector finds its targets)."""
    return {**isolated_env(base / "home"), "GPT2_STACK_DIR": str(base / "stack"), faults.MARK_ENV: mark}


def gpt2(env: dict[str, str], *args: str, timeout: float = 900) -> dict[str, Any]:
    """One `gpt2` command with --json; its JSON line."""
    done = subprocess.run([sys.executable, "-m", "cli.main", *args, "--json"], env=env, cwd=PROJECT,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"gpt2 {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def settings(root: Path, work: Path) -> dict[str, Any]:
    return {"runtime.root": str(root), "runtime.work_dir": str(work), **TRAIN}


def reference_digest(env: dict[str, str], base: Path) -> str:
    """The soak config trained once, uninterrupted, outside the stack."""
    sets = [f"{k}={v}" for k, v in {**settings(base / "reference", base / "reference-work"),
                                    "tracking.enabled": "false"}.items()]
    args = [a for s in sets for a in ("--set", s)]
    gpt2(env, "prepare", "--preset", "smoke", *args)
    result = gpt2(env, "train", "--preset", "smoke", *args)
    return checks.digest(result["checkpoint"])


def mount_small(path: Path, size_mb: int) -> bool:
    """A tmpfs of `size_mb` at `path` for one pipeline's root and work dir, so a
    full disk fills only that (needs the right to mount; False without it)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


class Stack:
    """The soak's stack, through the same calls the tests make."""

    def __init__(self, env: dict[str, str], base: Path, max_reschedules: int, zombie_after_s: int):
        self.env, self.base = env, base
        self.info = gpt2(env, "stack", "up", "--root", str(base / "roots"), "--max-reschedules",
                         str(max_reschedules), "--zombie-after", str(zombie_after_s), timeout=600)
        self.state_dir = Path(self.info["state_dir"])

    def client(self):
        from cli.stack.prefect_setup import client
        from cli.stack.services import read_auth

        return client(self.info["prefect_api_url"], read_auth(self.state_dir))

    def start_pipeline(self, params: dict[str, Any]) -> str:
        done = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "gpt2/full-pipeline",
                               "--param", "preset=smoke", "--param", f"overrides={json.dumps(params)}"],
                              env=self.env, cwd=self.base, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"prefect deployment run failed: {done.stdout[-1000:]}{done.stderr[-1000:]}")
        return re.search(r"UUID: ([0-9a-f-]{36})", done.stdout).group(1)

    def read(self, run_id: str):
        """The flow run, or None while the server does not answer (restarting)."""
        try:
            with self.client() as c:
                return c.read_flow_run(run_id)
        except Exception:  # noqa: BLE001 - a server being restarted by the supervisor
            return None

    def final(self, run_id: str, timeout: float, crash_grace_s: float = 5 * 60):
        """The run once final; None if it is not final in time. A Crashed one
        gets `crash_grace_s` to be rescheduled first: the automation acts
        after 20 s, and where it misses a run (a server restart, a server too
        busy to act) the stack's rescheduler puts it back after 120 s, looking
        every 15 s (cli.stack.rescheduler). Five minutes covers both with room,
        and a pipeline truly left Crashed shows as one sooner than the 17
        minutes this waited before the rescheduler existed."""
        deadline = time.monotonic() + timeout
        crashed_at = None
        while time.monotonic() < deadline:
            run = self.read(run_id)
            if run is not None and run.state.is_final():
                if not run.state.is_crashed():
                    return run
                crashed_at = crashed_at or time.monotonic()
                if time.monotonic() - crashed_at > crash_grace_s:
                    return run
            else:
                crashed_at = None
            time.sleep(3)
        return None

    def stage_runs(self, parent_id: str) -> list:
        with self.client() as c:
            return [r for r in c.read_flow_runs(limit=200) if (r.idempotency_key or "").startswith(parent_id)]

    def down(self) -> None:
        try:
            gpt2(self.env, "stack", "down", timeout=600)
        except Exception as err:  # noqa: BLE001 - reported, never hiding the soak's result
            _say(f"stack down failed: {err}")


def pipeline_alive(mark: str, run_ids: set[str]) -> list[str]:
    left = []
    for proc in faults.soak_processes(mark):
        try:
            run = proc.environ().get("PREFECT__FLOW_RUN_ID")
            line = " ".join(proc.cmdline())
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
        if run in run_ids and ("prefect.engine" in line or "gpt2.train" in line):
            left.append(f"{proc.pid} {line[:120]}")
    return left


class Supervisor:
    """The platform: brings a dead server or worker back after a delay (a
    part can be held down longer: `hold`). Counts what it restarted."""

    def __init__(self, state_dir: Path, timing: faults.Timing, log: Callable[[str], None], env: dict[str, str]):
        self.state_dir, self.timing, self.log, self.env = state_dir, timing, log, env
        self.restarts: dict[str, int] = {}
        self.errors: list[str] = []
        self._held_until: dict[str, float] = {}
        self._dead_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="chaos-supervisor", daemon=True)

    def start(self) -> "Supervisor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=600)

    def hold(self, name: str, seconds: float) -> None:
        with self._lock:
            self._held_until[name] = time.monotonic() + seconds

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.tend()

    def tend(self) -> None:
        """One round: restart whatever has been dead for its delay."""
        state = services.read_state(self.state_dir)
        if state is None:
            return
        now = time.monotonic()
        for rec in state["processes"]:
            name = rec["name"]
            if processes.alive(rec):
                self._dead_since.pop(name, None)
                continue
            since = self._dead_since.setdefault(name, now)
            with self._lock:
                held = self._held_until.get(name, 0.0)
            if now - since < self.timing.restart_delay_s or now < held:
                continue
            self.log(f"supervisor: {name} is down; restarting it")
            # In the stack's own environment (its home, its mark), as the unit
            # file or the pod spec that started it would.
            done = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                                   "from cli.stack.services import restart; restart(Path(sys.argv[1]), sys.argv[2])",
                                   str(self.state_dir), name], env=self.env, cwd=PROJECT, capture_output=True,
                                  text=True, timeout=600)
            if done.returncode == 0:
                self.restarts[name] = self.restarts.get(name, 0) + 1
            else:  # a platform retries at the next round; the error goes into the soak's result
                self.errors.append(f"restarting {name}: {done.stderr.strip()[-500:]}")
                self.log(f"supervisor: restarting {name} failed: {done.stderr.strip()[-300:]}")
            self._dead_since.pop(name, None)
