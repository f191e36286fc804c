"""Tokenizer workers that die or meet huge documents: a SIGKILLed worker is an
error naming it within bounded time, never a hang, and the rerun resumes to the
clean run's parts; documents over data.max_document_chars are cut and counted;
long runs without whitespace finish; the stream is unchanged on normal text.
Real worker processes and real kills throughout."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import string
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import pytest

from gpt2.config.identity import data_fingerprint, data_step_fingerprint
from gpt2.config.overrides import resolve_config
from gpt2.data import sources
from gpt2.data.download import download_source
from gpt2.data.tokenize import tokenize_source
from gpt2.data.tokenize_pool import TokenizeWorkerError, encode_batch, tokenize_stream
from gpt2.errors import UserError
from gpt2.root import layout
from gpt2.tokenizer import EOT_TOKEN, get_encoding
from tests.conftest import write_jsonl

HANG_S = 60
"""Far above any of these runs (a few seconds each): past it, the run hangs."""


@contextmanager
def deadline(seconds: int = HANG_S):
    """Fail instead of hanging: SIGALRM raises in the main thread, wherever it waits."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def worker_pids() -> list[int]:
    """This process's tokenize workers still running, as the OS lists them."""
    workers = [p for p in psutil.Process().children() if "gpt2.data.pool_worker" in " ".join(_cmdline(p))]
    return [p.pid for p in workers if p.status() != psutil.STATUS_ZOMBIE]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # gone meanwhile
        return []


def kill_a_worker() -> int:
    pid = worker_pids()[0]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.fixture
def paragraphs() -> list[str]:
    """Real English prose: the paragraphs of Python's own docs (~500)."""
    from pydoc_data.topics import topics

    return [p for key in sorted(topics) for p in topics[key].split("\n\n") if len(p.strip()) > 40]


def test_killed_worker_is_a_named_error_not_a_hang(paragraphs):
    batches = [paragraphs[i:i + 10] for i in range(0, 100, 10)]
    killed = []

    def feed():
        for i, texts in enumerate(batches):
            # Batches 0 and 1 are out, one on each worker, not answered yet: the
            # killed worker holds one (it may not have started encoding it).
            if i == 2:
                killed.append(kill_a_worker())
            yield texts

    with deadline(), pytest.raises(TokenizeWorkerError) as info:
        list(tokenize_stream(feed(), num_workers=2))
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert f"pid {killed[0]}" in message and "SIGKILL" in message
    assert "documents 0-9 (batch 0)" in message or "documents 10-19 (batch 1)" in message
    assert "runtime.num_workers" in message and "data.max_document_chars" in message
    assert not worker_pids(), "the other worker outlived the failed stream"


def test_worker_exception_names_the_documents(paragraphs):
    batches = [paragraphs[:3], paragraphs[3:5] + [None], paragraphs[5:9]]
    with deadline(), pytest.raises(TokenizeWorkerError, match=r"documents 3-5 \(batch 1\): TypeError"):
        list(tokenize_stream(batches, num_workers=2, first_document=0))
    assert not worker_pids()


@pytest.fixture
def pooled_corpus(smoke_config, tmp_path, paragraphs):
    """Config and source for a corpus of ~16 batches that goes through 2 worker
    processes (sizes unknown, as for a remote glob), in parts of a few batches."""
    src = write_jsonl(tmp_path / "corpus.jsonl", [{"text": t} for t in paragraphs * 8])

    def make(work: str):
        config = smoke_config(**{"data.source": str(src), "runtime.num_workers": 2,
                                 "runtime.tokenize_part_tokens": 40_000, "runtime.work_dir": str(tmp_path / work)})
        return config, dataclasses.replace(download_source(config), sizes=())

    return make


def part_bytes(result) -> list[bytes]:
    return [(Path(result.directory) / name).read_bytes() for name in result.parts]


def test_rerun_after_a_killed_worker_gives_the_clean_parts(pooled_corpus):
    config, source = pooled_corpus("clean")
    with deadline():
        clean = tokenize_source(config, source, show_progress=False)
    assert len(clean.parts) >= 3

    config, source = pooled_corpus("killed")
    killed = []

    def kill_midway(docs, tokens, total):
        if docs >= 1500 and not killed:
            killed.append(kill_a_worker())

    with deadline(), pytest.raises(TokenizeWorkerError) as info:
        tokenize_source(config, source, kill_midway, show_progress=False)
    assert f"pid {killed[0]}" in str(info.value)
    directory = layout.data_step_dir(config, "tokenize")
    sealed = sorted(p.name for p in directory.glob("part_*.bin"))
    assert sealed, "no part was sealed before the kill"
    assert not (directory / "done.json").exists()
    assert not worker_pids()

    with deadline():
        resumed = tokenize_source(config, source, show_progress=False)
    assert (resumed.documents, resumed.tokens, resumed.parts) == (clean.documents, clean.tokens, clean.parts)
    assert part_bytes(resumed) == part_bytes(clean)


def test_huge_document_is_truncated_and_counted(smoke_config, tmp_path, paragraphs, caplog):
    cap = 1_000_000  # the default
    huge = "".join(random.Random(0).choices(string.ascii_lowercase + " ", k=3 * cap))
    docs = paragraphs[:50] + [huge] + paragraphs[50:100] + ["x" * (cap + 1), "y" * cap]
    config = smoke_config(**{"data.source": str(write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in docs]))})
    assert config.data.max_document_chars == cap
    with caplog.at_level(logging.WARNING, logger="gpt2.data.tokenize"), deadline():
        result = tokenize_source(config, download_source(config), show_progress=False)
    assert result.truncated == 2 and result.documents == len(docs)
    stream = np.concatenate([np.fromfile(Path(result.directory) / p, dtype=np.uint16) for p in result.parts])
    assert np.array_equal(stream, encode_batch([t[:cap] for t in docs]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("document 50 has 3000000 characters" in w for w in warnings)
    assert any(w.startswith("2 documents were longer than data.max_document_chars=1000000") for w in warnings)

    smaller = smoke_config(**{"data.source": config.data.source, "data.max_document_chars": 500})
    cut = tokenize_source(smaller, download_source(smaller), show_progress=False)
    assert cut.truncated == sum(len(t) > 500 for t in docs) and cut.directory != result.directory


def test_cap_keeps_existing_fingerprints_at_its_default():
    # Fingerprints of the gpt2-124m data computed before data.max_document_chars
    # existed: data prepared then must keep its address.
    default = resolve_config("gpt2-124m", {})
    explicit = resolve_config("gpt2-124m", {"data.max_document_chars": 1_000_000})
    for config in (default, explicit):
        assert data_fingerprint(config) == "069704638501314e"
        assert data_step_fingerprint(config, "tokenize") == "96c19cfb045cbe6a"
    capped = resolve_config("gpt2-124m", {"data.max_document_chars": 10_000})
    assert data_step_fingerprint(capped, "tokenize") != data_step_fingerprint(default, "tokenize")
    assert data_fingerprint(capped) != data_fingerprint(default)
    assert data_step_fingerprint(capped, "download") == data_step_fingerprint(default, "download")


def test_stream_is_plain_tiktoken_on_normal_text_for_any_workers():
    docs = [d["text"] for d in sources.builtin_documents("builtin:python-docs")]
    enc = get_encoding()
    expected = np.concatenate([[EOT_TOKEN, *enc.encode_ordinary(t)] for t in docs]).astype(np.uint16)
    rng = random.Random(1)
    cuts = sorted(rng.sample(range(1, len(docs)), 12))
    batches = [docs[a:b] for a, b in zip([0, *cuts], [*cuts, len(docs)])]  # uneven, so workers finish out of order
    for workers in (1, 3):
        with deadline():
            out = list(tokenize_stream(iter(batches), num_workers=workers, window=4))
        assert [n for n, _ in out] == [len(b) for b in batches]
        assert np.array_equal(np.concatenate([a for _, a in out]), expected)


def test_million_char_runs_without_whitespace_finish():
    rng = random.Random(2)
    n = 1_000_000
    blobs = ["a" * n, "".join(rng.choices(string.digits, k=n)), "".join(rng.choices(string.ascii_lowercase, k=n)),
             "".join(rng.choices(string.ascii_letters + string.digits + "+/", k=n)), "-" * n]
    enc = get_encoding()
    with deadline():  # seconds with tiktoken >= 0.13, hours with the quadratic merge of older ones
        out = list(tokenize_stream([[b] for b in blobs], num_workers=2))
    for blob, (_, tokens) in zip(blobs, out):
        assert tokens[0] == EOT_TOKEN and enc.decode(tokens[1:].tolist()) == blob
