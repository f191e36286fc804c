"""Benchmark: what starting with the garbage collector paused (gpt2.process.collector) saves a
trainer and a preflight, the two processes every training attempt starts.

    python -m bench.process_start              # 3 rounds
    python -m bench.process_start --rounds 5

Each round runs each command twice, alternating which goes first: as a user's process starts it
(`python -m gpt2.train` / `python -m gpt2.preflight`: the collector paused until the start is over)
and as the same code imported as a module and called (`from gpt2.train.__main__ import main`:
nothing pauses, the collector runs as Python's default; the baseline). The trainer trains the
smoke preset 2 steps on a root prepared once (so its start is most of it), fresh each time; the
preflight is the training flow's (`--steps 2`) with `--synthetic`. CPU is each process's, from the
kernel's rusage; the ratio of the medians is printed.
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

# Each entry point's `if __name__ == "__main__":` block without its `collector.pause()`: the same code,
# the same end (the trainer freezes its heap before it exits, as gpt2/train/__main__.py does).
BASELINE = {"gpt2.train": "import gc, sys; from gpt2.train.__main__ import main; c = main(); gc.freeze(); sys.exit(c)",
            "gpt2.preflight": "import sys; from gpt2.preflight.__main__ import main; sys.exit(main())"}


def _run(module: str, args: list[str], paused: bool) -> tuple[float, float]:
    cmd = [sys.executable, "-m", module] if paused else [sys.executable, "-c", BASELINE[module]]
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
                    "preflight": ("gpt2.preflight", ["--config", str(run), "--synthetic", "--steps", "2", "--json"])}
        runs: dict[str, dict[bool, list[tuple[float, float]]]] = {name: {True: [], False: []} for name in commands}
        for i in range(args.rounds):
            for name, (module, cmd_args) in commands.items():
                for paused in ([True, False] if i % 2 == 0 else [False, True]):
                    runs[name][paused].append(_run(module, cmd_args, paused))
    result = {}
    for name, by in runs.items():
        paused, default = ({"cpu_s": round(statistics.median(c for c, _ in r), 2),
                            "wall_s": round(statistics.median(w for _, w in r), 2)} for r in (by[True], by[False]))
        result[name] = {"paused start": paused, "collector as default (baseline)": default,
                        "cpu_ratio": round(paused["cpu_s"] / default["cpu_s"], 2),
                        "wall_ratio": round(paused["wall_s"] / default["wall_s"], 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
