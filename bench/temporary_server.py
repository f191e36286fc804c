"""Benchmark: what starting Prefect's temporary server without registering block types
(cli.common.TEMPORARY_SERVER_QUICK_START) saves a `gpt2` command that starts one.

    python -m bench.temporary_server              # 3 rounds
    python -m bench.temporary_server --rounds 5

Each round runs the same command twice, alternating which goes first: `gpt2 prepare --preset smoke`
on a root whose data is already prepared (so the command is little more than its temporary server's
start, the cached data flow and the stop), once as `gpt2` sets it and once with
Prefect's defaults set by hand (PREFECT_API_BLOCKS_REGISTER_ON_START and
PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION true: a user's values win; the baseline).
CPU is the command's and its children's (the server is one), from the kernel's rusage; the ratio
of the medians is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cli.common import TEMPORARY_SERVER_QUICK_START


def _run(root: Path, work: Path, register: bool) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(work / "prefect-home")
    if register:  # Prefect's defaults, set by hand: a user's values win over gpt2's
        env.update(dict.fromkeys(TEMPORARY_SERVER_QUICK_START, "true"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli.main", "prepare", "--preset", "smoke", "--root", str(root),
                    "--set", f"runtime.work_dir={work}", "--json"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root, work = Path(tmp) / "root", Path(tmp) / "work"
        _run(root, work, register=False)  # the data prepared once: every timed run finds it cached
        runs: dict[str, list[tuple[float, float]]] = {"quick start": [], "registering (baseline)": []}
        for i in range(args.rounds):
            order = [False, True] if i % 2 == 0 else [True, False]
            for register in order:
                runs["registering (baseline)" if register else "quick start"].append(_run(root, work, register))
    result = {name: {"cpu_s": round(statistics.median(c for c, _ in r), 2),
                     "wall_s": round(statistics.median(w for _, w in r), 2)} for name, r in runs.items()}
    base, quick = result["registering (baseline)"], result["quick start"]
    result["cpu_ratio"] = round(quick["cpu_s"] / base["cpu_s"], 2)
    result["wall_ratio"] = round(quick["wall_s"] / base["wall_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
