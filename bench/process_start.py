"""Benchmark: what a process of ours saves by how it treats Python's garbage collector: the trainer
and the preflight start with it paused (gpt2.process.collector), the preflight and a flow-run process
freeze their heap as they exit (the trainer and `gpt2` already did), so that the interpreter's final
collection does not walk and free it object by object.

    python -m bench.process_start              # 3 rounds
    python -m bench.process_start --rounds 5

Each round runs each command twice, alternating which goes first: as it starts now, and with
Python's defaults (the baseline): the same code imported and called with nothing paused
(`from gpt2.train.__main__ import main`) and, for the preflight and the flow-run process, no freeze
at exit (the trainer's baseline keeps the one it had before the collector was paused). The trainer
trains the smoke preset 2 steps on a root prepared once, fresh each time; the preflight is the
training flow's (`--steps 2`) with `--synthetic`; the flow-run process stands in as what it imports
before its flow runs (Prefect's engine, the training flow, MLflow), its flow not run. CPU is each
process's, from the kernel's rusage; the ratio of the medians is printed.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Each command as it starts now, and its baseline with Python's defaults.
NOW = {"gpt2.train": ["-m", "gpt2.train"], "gpt2.preflight": ["-m", "gpt2.preflight"],
       "flow-run": ["-c", "import prefect.engine, flows.train, mlflow"]}
BASELINE = {"gpt2.train": ["-c", ("import gc, sys; from gpt2.train.__main__ import main; c = main(); gc.freeze(); "
                                  "sys.exit(c)")],
            "gpt2.preflight": ["-c", "import sys; from gpt2.preflight.__main__ import main; sys.exit(main())"],
            "flow-run": ["-c", ("import atexit, gc, flows; atexit.unregister(gc.freeze); "
                                "import prefect.engine, flows.train, mlflow")]}


def _run(module: str, args: list[str], now: bool) -> tuple[float, float]:
    cmd = [sys.executable, *(NOW if now else BASELINE)[module]]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd + args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def _config(tmp: Path) -> Path:
    from gpt2.config.overrides import resolve_config

    root, work = tmp / "root", tmp / "work"
    subprocess.run([sys.executable, "-m", "cli.main", "prepare", "--preset", "smoke", "--root", str(root),
                    "--set", f"runtime.work_dir={work}", "--json"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = resolve_config("smoke", {"runtime.work_dir": str(work), "train.max_steps": 2,
                                      "train.checkpoint_every": 2}, root=str(root))
    path = tmp / "run.json"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run = _config(Path(tmp))
        commands = {"trainer": ("gpt2.train", ["--config", str(run), "--fresh"]),
                    "preflight": ("gpt2.preflight", ["--config", str(run), "--synthetic", "--steps", "2", "--json"]),
                    "flow-run process": ("flow-run", [])}
        runs: dict[str, dict[bool, list[tuple[float, float]]]] = {name: {True: [], False: []} for name in commands}
        for i in range(args.rounds):
            for name, (module, cmd_args) in commands.items():
                for now in ([True, False] if i % 2 == 0 else [False, True]):
                    runs[name][now].append(_run(module, cmd_args, now))
    result = {}
    for name, by in runs.items():
        now, default = ({"cpu_s": round(statistics.median(c for c, _ in r), 2),
                         "wall_s": round(statistics.median(w for _, w in r), 2)} for r in (by[True], by[False]))
        result[name] = {"now": now, "python's defaults (baseline)": default,
                        "cpu_ratio": round(now["cpu_s"] / default["cpu_s"], 2),
                        "wall_ratio": round(now["wall_s"] / default["wall_s"], 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
