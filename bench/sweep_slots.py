"""A sweep's wall time with one GPU slot and with two, on the local stack (#62's check: the same
sweep with two slots takes measurably less wall time than with one; a ratio, not a timed assertion).

    python -m bench.sweep_slots                 # smoke preset, 2 members, about 12 minutes on 2 cores
    python -m bench.sweep_slots --members 4

Starts `gpt2 stack up` in a temporary home and runs `prefect deployment run gpt2/sweep` with the
same members twice, each on a fresh root (each pays its data stage once): first with the stack's
`gpu` pool and its train and evaluate deployments at one slot (prefect.yaml's guardrail), then at
two with runtime.max_parallel_runs=2. Prints both wall times and their ratio; the stack goes down.
On a CPU-only machine the trainers of two slots share its cores: the ratio says what the
orchestration overlaps (start-up, data waits, evaluate and export beside training), not a GPU's.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEPLOYMENTS = ("gpt2-train/train", "gpt2-eval/evaluate")


def _cli(env: dict, cwd: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:3])} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def _client(stack: dict):
    """A Prefect client of the stack's server, with its auth string."""
    from cli.stack.prefect_setup import client

    return client(stack["prefect_api_url"], Path(stack["prefect_auth_file"]).read_text().strip())


def set_slots(stack: dict, slots: int) -> None:
    """The `gpu` pool and its GPU deployments at `slots` runs at once."""
    from prefect.client.schemas.actions import DeploymentUpdate, WorkPoolUpdate

    with _client(stack) as c:
        c.update_work_pool("gpu", WorkPoolUpdate(concurrency_limit=slots))
        for name in DEPLOYMENTS:
            c.update_deployment(c.read_deployment_by_name(name).id, DeploymentUpdate(concurrency_limit=slots))


def timed_sweep(stack: dict, env: dict, base: Path, lrs: list[float], slots: int) -> float:
    """Wall seconds from `prefect deployment run gpt2/sweep` to the sweep's final state."""
    overrides = {"runtime.root": str(base / f"root-{slots}"), "runtime.work_dir": str(base / f"work-{slots}"),
                 "runtime.max_parallel_runs": slots, "train.max_steps": 12}
    started = time.perf_counter()
    out = _cli(env, base, "prefect", "deployment", "run", "gpt2/sweep", "--param", "preset=smoke",
               "--param", f"overrides={json.dumps(overrides)}", "--param", f"grid={json.dumps({'train.lr': lrs})}")
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)
    with _client(stack) as c:
        while not (run := c.read_flow_run(run_id)).state.is_final():
            time.sleep(2)
    if not run.state.is_completed():
        raise SystemExit(f"the {slots}-slot sweep ended {run.state.name}: {run.state.message}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=2)
    args = parser.parse_args()
    from cli.stack.prefect_setup import isolated_env

    lrs = [round(1e-3 * (i + 1), 6) for i in range(args.members)]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        env = isolated_env(base / "home")
        stack = json.loads(_cli(env, base, "cli.main", "stack", "up", "--root", str(base / "root"),
                                "--json").strip().splitlines()[-1])
        try:
            one = timed_sweep(stack, env, base, lrs, 1)
            set_slots(stack, 2)
            two = timed_sweep(stack, env, base, lrs, 2)
        finally:
            subprocess.run([sys.executable, "-m", "cli.main", "stack", "down"], env=env, cwd=base,
                           capture_output=True, timeout=300)
    print(f"sweep of {args.members} smoke members: 1 slot {one:.0f} s, 2 slots {two:.0f} s, ratio {two / one:.2f}")


if __name__ == "__main__":
    main()
