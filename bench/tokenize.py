"""Tokenizer throughput: the project's prepare path against llm.c's fineweb.py
and the core limit, repeated and interleaved so that a 10% change shows.

    python bench/tokenize.py                            # corpora of 20 and 40 MB, 3 rounds
    python bench/tokenize.py --sizes 130,260 --repeat 5
    python bench/tokenize.py --compare-tree ../old      # add another checkout's prepare path

Each round runs, for every corpus size and in an order that rotates from round
to round (so load drift on a shared machine hits all alike), each in a fresh
process (bench/tokenize_runs.py):
  (a) `gpt2.data.prepare.prepare_data`: source → work units → parts → shards →
      artifact root (workers read and tokenize units; the parent hands them out);
  (a0) the same from --compare-tree's checkout, when given;
  (b) a baseline shaped like llm.c's dev/data/fineweb.py: Pool.imap over single
      documents, one encode_ordinary and one numpy conversion per document,
      shards written by the parent;
  (c) the limit: one core's encode_ordinary over the texts in memory (CPU and
      wall), and the parallel ceiling (WORKERS processes doing only that).
Figures, each as median [min-max] over the rounds:
  CPU ns per token (all processes' CPU, coordinator and workers, over tokens):
      the figure other load on the machine disturbs least, so it leads;
  marginal figures between the smallest and largest size, paired within a
      round, so start-up (spawning, imports, loading the encoding) cancels;
  the coordinating process's share of the stage's CPU: its own CPU over its
      own plus its workers' (1/share is the most cores it can keep busy).
The corpus (unless --corpus is given) is bench/corpus.py's: real, varied
English in 1-10 KB documents, JSONL with a "text" field; smaller sizes are
line-aligned prefixes of the largest.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's directory leads sys.path and its name would
# shadow the stdlib `tokenize` (used by linecache, inspect, ...): drop it.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))  # the repository, for bench.corpus

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench.corpus import build_corpus  # noqa: E402

RUNNER = os.path.join(_HERE, "tokenize_runs.py")


def run(kind: str, corpus: Path, tmp: Path, workers: int, tree: Path | None = None) -> dict:
    tmp.mkdir(parents=True)
    args = [sys.executable, RUNNER, kind.split("@")[0], str(corpus), str(tmp), str(workers)]
    proc = subprocess.run(args + ([str(tree)] if tree else []), capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{kind} run on {corpus} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def prefix(corpus: Path, mb: float, out: Path) -> Path:
    """The corpus's first whole lines up to `mb` MB."""
    budget = int(mb * 1e6)
    with open(corpus, "rb") as src, open(out, "wb") as dst:
        for line in src:
            if budget <= 0:
                break
            budget -= dst.write(line)
    return out


def measure(corpora: list[Path], tmp: Path, workers: int, repeat: int, tree: Path | None) -> list[dict]:
    """rounds[i][(kind, size index)] = that run's figures."""
    kinds = ["project", "baseline", "limit"] + (["project@base"] if tree else [])
    plan = [(k, s) for s in range(len(corpora)) for k in kinds]
    rounds = []
    for i in range(repeat):
        order = plan[i % len(plan):] + plan[:i % len(plan)]  # rotate: each run sees each slot
        runs = {}
        for kind, s in order:
            where = tmp / f"r{i}-{kind.replace('@', '-')}-{s}"
            runs[kind, s] = run(kind, corpora[s], where, workers, tree if kind == "project@base" else None)
            if kind != "limit":
                subprocess.run(["rm", "-rf", str(where)], check=True)  # a few GB over a long run
        rounds.append(runs)
        big = len(corpora) - 1
        print(f"round {i + 1}/{repeat}: " + "  ".join(
            f"{k} {runs[k, big]['tokens'] / _wall(runs[k, big]) / 1e6:.2f}" for k in kinds)
            + f" Mtok/s on the largest; load average {os.getloadavg()[0]:.1f}", flush=True)
    return rounds


def _wall(r: dict) -> float:
    return r.get("wall_s", r.get("one_core_wall_s"))


def _cpu(r: dict) -> float:
    return r["coordinator_cpu_s"] + r["workers_cpu_s"] if "workers_cpu_s" in r else r["one_core_cpu_s"]


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{fmt.format(mid)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def figures(runs: dict, kind: str, small: int, big: int, workers: int) -> dict:
    """One round's figures for one kind: per token on the largest corpus, and
    marginal (largest minus smallest, start-up cancels)."""
    b, s = runs[kind, big], runs[kind, small]
    dt = b["tokens"] - s["tokens"]
    out = {"cpu_ns": 1e9 * _cpu(b) / b["tokens"], "rate": b["tokens"] / _wall(b) / 1e6}
    if dt > 0:
        out["m_cpu_ns"] = 1e9 * (_cpu(b) - _cpu(s)) / dt
        out["m_rate"] = dt / (_wall(b) - _wall(s)) / 1e6
    if kind == "limit":  # cores x one core, and what `workers` encode-only processes really gave
        out["rate"] *= workers
        if "m_rate" in out:
            out["m_rate"] *= workers
        out["ceiling"] = b["tokens"] / b["ceiling_wall_s"] / 1e6
        out["ceiling_cpu_ns"] = 1e9 * b["ceiling_cpu_s"] / b["tokens"]
    else:
        out["share"] = 100 * b["coordinator_cpu_s"] / _cpu(b)
        out["startup_s"] = s["startup_s"]
    return out


def report(rounds: list[dict], sizes: list[float], workers: int, tree: Path | None) -> None:
    small, big = 0, len(sizes) - 1
    kinds = ["project"] + (["project@base"] if tree else []) + ["baseline", "limit"]
    per = {k: [figures(r, k, small, big, workers) for r in rounds] for k in kinds}
    for k in kinds:
        tokens = {r[k, big]["tokens"] for r in rounds}
        if len(tokens) != 1 or tokens != {rounds[0]["limit", big]["tokens"]}:
            raise SystemExit(f"token counts differ on the largest corpus: {k} {sorted(tokens)}")
    label = {"project": "(a) prepare_data", "project@base": f"(a0) prepare_data at {tree}",
             "baseline": "(b) fineweb.py-style", "limit": f"(c) limit: {workers} x one core"}
    marg = len(sizes) > 1
    print(f"\n{workers} processes, {len(rounds)} rounds; median [min-max] over rounds; "
          f"tokens on the largest corpus ({sizes[big]:g} MB): {rounds[0]['limit', big]['tokens']:,}")
    print(f"{'':34} {'CPU ns/token':>22} {'marginal CPU ns/token':>22} {'Mtok/s':>20} {'marginal Mtok/s':>20}")
    for k in kinds:
        def col(key: str, fmt: str = "{:.1f}", f: list = per[k]) -> str:
            return spread([x[key] for x in f], fmt) if key in f[0] else "-"

        print(f"{label[k]:34} {col('cpu_ns'):>22} {col('m_cpu_ns'):>22} {col('rate', '{:.2f}'):>20} "
              f"{col('m_rate', '{:.2f}'):>20}")
    print(f"{'    measured parallel ceiling':34} {spread([x['ceiling_cpu_ns'] for x in per['limit']], '{:.1f}'):>22} "
          f"{'':>22} {spread([x['ceiling'] for x in per['limit']]):>20}   ({workers} processes side by side, "
          "encode only, texts in memory)")
    def ratio(num: str, den: str, field: str, invert: bool = False) -> str:
        pairs = [(a[field], c[field]) for a, c in zip(per[num], per[den])]
        return spread([(c / a) if invert else (a / c) for a, c in pairs])

    rows = [("(a)/(b)", "baseline", ">= 1.2"), ("(a)/(c)", "limit", ">= 0.9")]
    rows += [("(a)/(a0)", "project@base", "")] if tree else []
    print("\nper round, then median [min-max];  CPU: the other's CPU per token over (a)'s;  Mtok/s: (a)'s over the other's")
    for name, other, target in rows:
        cpu = f"CPU {ratio('project', other, 'cpu_ns', invert=True)}"
        mcpu = f"marginal CPU {ratio('project', other, 'm_cpu_ns', invert=True)}" if marg else ""
        wall = f"Mtok/s {ratio('project', other, 'rate')}"
        mwall = f"marginal Mtok/s {ratio('project', other, 'm_rate')}" if marg else ""
        print(f"{name:9} {cpu:22} {mcpu:31} {wall:25} {mwall:31} {('target ' + target) if target else ''}")
    own = "m_cpu_ns" if marg else "cpu_ns"  # the ceiling is encoding alone: no start-up in it
    print(f"{'(a)/ceil':9} CPU {spread([c['ceiling_cpu_ns'] / a[own] for a, c in zip(per['project'], per['limit'])])}"
          f"{'':31} Mtok/s {spread([a['rate'] / c['ceiling'] for a, c in zip(per['project'], per['limit'])])}")
    for k in kinds[:-1]:
        print(f"coordinator's share of the stage's CPU {label[k]}: {spread([x['share'] for x in per[k]])}% "
              f"(largest corpus){'  target <= 3%' if k == 'project' else ''};  start-up to first tokens "
              f"{spread([x['startup_s'] for x in per[k]])} s")
    print("load average now: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, help="one corpus of this size, in MB of JSONL (as --sizes MB)")
    parser.add_argument("--sizes", default="20,40", help="corpus sizes in MB, comma-separated: marginal "
                        "figures are taken between the smallest and the largest")
    parser.add_argument("--corpus", type=Path, help="use this JSONL (a 'text' field per line) as the "
                        "largest size instead of building one")
    parser.add_argument("--workers", type=int, default=0, help="processes for (a) and (b); 0: every core")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, interleaved")
    parser.add_argument("--compare-tree", type=Path, help="another checkout whose prepare path runs as (a0)")
    args = parser.parse_args()
    from gpt2.data.process_pool import default_workers

    workers = args.workers or default_workers()
    sizes = sorted([args.mb] if args.mb else [float(x) for x in args.sizes.split(",")])
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as name:
        tmp = Path(name)
        largest = args.corpus
        if largest is None:
            largest, t = tmp / "corpus.jsonl", time.perf_counter()
            build_corpus(largest, sizes[-1])
            print(f"built the corpus in {time.perf_counter() - t:.1f}s")
        else:
            sizes[-1] = largest.stat().st_size / 1e6
        corpora = [prefix(largest, mb, tmp / f"corpus-{mb:g}.jsonl") for mb in sizes[:-1]] + [largest]
        sizes = [c.stat().st_size / 1e6 for c in corpora]
        print(f"corpora: {', '.join(f'{s:.1f}' for s in sizes)} MB; {workers} workers; load average "
              + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
        rounds = measure(corpora, tmp, workers, args.repeat, args.compare_tree)
    report(rounds, sizes, workers, args.compare_tree)


if __name__ == "__main__":
    main()
