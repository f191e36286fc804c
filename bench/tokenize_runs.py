"""One measured run of bench/tokenize.py, in a fresh process of its own, so
that its CPU time is exactly its own (RUSAGE_SELF: the coordinator) and its
workers' (RUSAGE_CHILDREN, once joined), and every run starts as cold as a
user's `gpt2 prepare` does.

    python bench/tokenize_runs.py project|baseline|limit CORPUS TMPDIR WORKERS [TREE]

TREE: a checkout of the project whose gpt2 package the `project` run uses
(another commit's, to compare with it in the same benchmark); default this
one. Prints one JSON object on stdout: tokens, wall_s, startup_s (until the
first tokens came back), coordinator_cpu_s, workers_cpu_s, and for `limit`
one_core_cpu_s / one_core_wall_s (a single process encoding the texts held in
memory) and ceiling_wall_s / ceiling_cpu_s (WORKERS processes doing only
that, side by side: cores that share caches or are busy make each slower).
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's directory leads sys.path and bench/tokenize.py
# would shadow the stdlib `tokenize`: drop it, and put the tree to measure first.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.abspath(sys.argv[5]) if len(sys.argv) > 5 else os.path.dirname(_HERE))

import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from resource import RUSAGE_CHILDREN, RUSAGE_SELF, getrusage  # noqa: E402

import numpy as np  # noqa: E402

from gpt2.data.llmc import write_shard  # noqa: E402
from gpt2.tokenizer import EOT_TOKEN, get_encoding  # noqa: E402

SHARD_SIZE = 100_000_000  # llm.c's default, for the project and the baseline alike


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process and of its finished (joined) children."""
    return tuple(r.ru_utime + r.ru_stime for r in map(getrusage, (RUSAGE_SELF, RUSAGE_CHILDREN)))


def _measured(t0: float, cpu0: tuple[float, float], first: float | None, tokens: int) -> dict:
    own, children = (after - before for after, before in zip(_cpu(), cpu0))
    end = time.perf_counter()
    return {"tokens": tokens, "wall_s": end - t0, "startup_s": (first or end) - t0,
            "coordinator_cpu_s": own, "workers_cpu_s": children}


def read_texts(path: Path):
    # Parsed in the parent, one document at a time, as fineweb.py iterates its dataset.
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


# --- the project's path: gpt2.data.prepare.prepare_data -----------------------


def run_project(corpus: Path, tmp: Path, workers: int) -> dict:
    from gpt2.config.overrides import resolve_config
    from gpt2.data.prepare import prepare_data

    config = resolve_config("smoke", {
        "data.source": str(corpus), "data.name": "bench", "data.val_tokens": 1_000_000,
        "data.shard_size": SHARD_SIZE, "runtime.work_dir": str(tmp / "work"),
        "runtime.num_workers": workers, "data.max_document_chars": 10**9,  # the others cut nothing either
    }, root=(tmp / "artifacts").as_uri())
    first: list[float] = []

    def progress(docs: int, tokens: int, total: int | None) -> None:
        if not first:
            first.append(time.perf_counter())

    t0, cpu0 = time.perf_counter(), _cpu()
    result = prepare_data(config, progress=progress, show_progress=False)
    return _measured(t0, cpu0, first[0] if first else None, result.total_tokens)


# --- a baseline shaped like llm.c's dev/data/fineweb.py -------------------------

_enc = None


def _init_baseline() -> None:
    global _enc
    _enc = _enc or get_encoding()  # inherited under fork, built here under spawn


def _tokenize_doc(doc: dict) -> np.ndarray:
    tokens = [EOT_TOKEN]  # every document starts with <|endoftext|>
    tokens.extend(_enc.encode_ordinary(doc["text"]))
    tokens_np = np.array(tokens)
    assert (0 <= tokens_np).all() and (tokens_np < 2**16).all(), "token id out of uint16 range"
    return tokens_np.astype(np.uint16)


def _write(directory: Path, index: int, tokens: np.ndarray) -> None:
    split = "val" if index == 0 else "train"
    with open(directory / f"baseline_{split}_{index:06d}.bin", "wb") as f:
        write_shard(f, tokens)


def run_baseline(corpus: Path, tmp: Path, workers: int) -> dict:
    """Pool.imap over single documents (chunksize 16), one encode_ordinary and
    one numpy conversion per document, a preallocated shard buffer in the
    parent, shards on disk."""
    out = tmp / "baseline"
    out.mkdir(parents=True)
    global _enc
    t0, first, total, cpu0 = time.perf_counter(), None, 0, _cpu()
    _enc = get_encoding.__wrapped__()  # built fresh in the parent, as fineweb.py does at import
    # The default start method, as fineweb.py uses (fork on Linux: workers inherit _enc).
    with mp.Pool(workers, initializer=_init_baseline) as pool:
        buf, count, index = np.empty(SHARD_SIZE, dtype=np.uint16), 0, 0
        for tokens in pool.imap(_tokenize_doc, read_texts(corpus), chunksize=16):
            first = first or time.perf_counter()
            total += len(tokens)
            if count + len(tokens) < SHARD_SIZE:
                buf[count:count + len(tokens)] = tokens
                count += len(tokens)
                continue
            room = SHARD_SIZE - count  # fill this shard, spill the rest into the next
            buf[count:] = tokens[:room]
            _write(out, index, buf)
            index, count = index + 1, len(tokens) - room
            buf[:count] = tokens[room:]
        if count:
            _write(out, index, buf[:count])
        pool.close()
        pool.join()  # joined, so the workers' CPU time is counted
    return _measured(t0, cpu0, first, total)


# --- the limit: tiktoken alone on texts in memory -------------------------------


def _texts(corpus: Path) -> list[str]:
    return [doc["text"] for doc in read_texts(corpus)]


def _encode_slice(corpus: Path, index: int, workers: int, barrier, cpu) -> None:
    enc, texts = get_encoding(), _texts(corpus)[index::workers]
    enc.encode_ordinary("warm up")
    barrier.wait()  # everyone loaded: from here on only encoding is timed
    c0 = time.process_time()
    for text in texts:
        enc.encode_ordinary(text)
    cpu.put(time.process_time() - c0)
    barrier.wait()  # done: process teardown stays out of the timing


def run_limit(corpus: Path, tmp: Path, workers: int) -> dict:
    """One core's encode_ordinary over the texts (CPU and wall), then the
    measured parallel ceiling: `workers` processes doing only that (shared or
    throttled cores make it less than cores x one core)."""
    enc, texts = get_encoding(), _texts(corpus)
    enc.encode_ordinary("warm up")  # the first call compiles the regex
    t0, c0 = time.perf_counter(), time.process_time()
    total = sum(len(enc.encode_ordinary(t)) for t in texts) + len(texts)  # + one EOT each
    one_core = {"one_core_cpu_s": time.process_time() - c0, "one_core_wall_s": time.perf_counter() - t0}
    barrier, cpu = mp.Barrier(workers + 1), mp.Queue()
    procs = [mp.Process(target=_encode_slice, args=(corpus, i, workers, barrier, cpu)) for i in range(workers)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    barrier.wait()
    ceiling = time.perf_counter() - t0
    ceiling_cpu = sum(cpu.get() for _ in procs)
    for p in procs:
        p.join()
    return {"tokens": total, **one_core, "ceiling_wall_s": ceiling, "ceiling_cpu_s": ceiling_cpu}


RUNS = {"project": run_project, "baseline": run_baseline, "limit": run_limit}


def main() -> None:
    kind, corpus, tmp, workers = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(RUNS[kind](corpus, tmp, workers)))


if __name__ == "__main__":
    main()
