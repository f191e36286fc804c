"""The data stage without Prefect: shards llm.c can read, documents that
round-trip, the val split first, limits, resume after a kill, bad input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from gpt2.config.overrides import resolve_config
from gpt2.data import prepare, sources
from gpt2.data.download import download_source
from gpt2.data.llmc import ShardError, read_shard
from gpt2.data.manifest import load_manifest, verify_manifest
from gpt2.data.shard import split_sizes
from gpt2.data.tokenize import EmptyCorpusError, tokenize_source
from gpt2.root import layout
from gpt2.root.storage import StorageError, local_path
from gpt2.tokenizer import EOT_TOKEN, get_encoding
from tests.conftest import write_jsonl


def llmc_read(path: Path) -> np.ndarray:
    """An independent reader following llm.c's dataloader: 256 int32 header
    (magic 20240520, version 1, ntok), then ntok uint16."""
    raw = path.read_bytes()
    magic, version, ntok = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1)
    assert len(raw) == 1024 + 2 * ntok
    return np.frombuffer(raw[1024:], dtype="<u2")


def shards_of(result) -> list[tuple[str, np.ndarray]]:
    manifest = load_manifest(result.manifest)
    return [(e.split, llmc_read(local_path(layout.shard(result.manifest, e.path)))) for e in manifest.shards]


def test_smoke_shards_roundtrip_every_document(smoke_config):
    config = smoke_config()
    result = prepare.prepare_data(config, show_progress=False)
    parts = shards_of(result)
    splits = [s for s, _ in parts]
    assert splits[0] == "val" and "train" in splits and splits == sorted(splits, key=lambda s: s != "val")
    assert sum(len(t) for s, t in parts if s == "val") == config.data.val_tokens
    assert result.total_tokens == sum(len(t) for _, t in parts)
    stream = np.concatenate([t for _, t in parts])
    # Every document is preceded by <|endoftext|>: decode between them.
    assert stream[0] == EOT_TOKEN
    bounds = np.flatnonzero(stream == EOT_TOKEN).tolist() + [len(stream)]
    enc = get_encoding()
    decoded = [enc.decode(stream[a + 1:b].tolist()) for a, b in zip(bounds, bounds[1:])]
    expected = [d["text"] for d in sources.builtin_documents("builtin:python-docs")]
    assert decoded == expected


def test_manifest_lists_every_shard_with_checksums(smoke_config):
    config = smoke_config(**{"data.shard_size": 20_000})
    result = prepare.prepare_data(config, show_progress=False)
    manifest = verify_manifest(result.manifest, checksum=True)
    names = [e.path for e in manifest.shards]
    assert names[0] == "python_docs_val_000000.bin"
    assert names[1] == "python_docs_train_000001.bin"
    assert all(e.tokens <= 20_000 for e in manifest.shards)
    assert manifest.fingerprint and manifest.tokenizer["name"] == "gpt2"
    assert manifest.source["documents"] == result.documents == 79
    raw = json.loads(Path(local_path(result.manifest)).read_text())
    assert {"path", "split", "tokens", "bytes", "sha256"} <= set(raw["shards"][0])


def test_limits_cut_exactly(smoke_config, tmp_path, prose_docs):
    src = write_jsonl(tmp_path / "corpus.jsonl", prose_docs)
    by_docs = prepare.prepare_data(
        smoke_config(**{"data.source": str(src), "data.max_documents": 50, "data.val_tokens": 100}), show_progress=False)
    assert by_docs.documents == 50
    by_tokens = prepare.prepare_data(
        smoke_config(**{"data.source": str(src), "data.max_tokens": 12_345, "data.val_tokens": 1000}), show_progress=False)
    assert by_tokens.total_tokens == 12_345


def test_small_corpus_still_gets_both_splits(smoke_config, tmp_path, prose_docs):
    src = write_jsonl(tmp_path / "small.jsonl", prose_docs[:20])
    result = prepare.prepare_data(smoke_config(**{"data.source": str(src), "data.val_tokens": 10**8}), show_progress=False)
    assert result.val_tokens > 0 and result.train_tokens > 0
    assert result.val_tokens == result.total_tokens // 10


def test_text_and_parquet_sources(smoke_config, tmp_path, prose_docs):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({"body": [d["text"] for d in prose_docs[:100]]}), tmp_path / "p" / "a.parquet")
    (tmp_path / "t").mkdir()
    for i, d in enumerate(prose_docs[:10]):
        (tmp_path / "t" / f"{i:02d}.txt").write_text(d["text"])
    pq_result = prepare.prepare_data(
        smoke_config(**{"data.source": f"file://{tmp_path}/p/*.parquet", "data.text_field": "body",
                        "data.val_tokens": 100}), show_progress=False)
    assert pq_result.documents == 100
    txt_result = prepare.prepare_data(
        smoke_config(**{"data.source": str(tmp_path / "t"), "data.val_tokens": 50}), show_progress=False)
    assert txt_result.documents == 10  # one document per .txt file


def test_resume_after_kill_gives_identical_shards(smoke_config, tmp_path, prose_docs):
    """A tokenization interrupted after some parts continues from there and
    yields byte-identical shards."""
    src = write_jsonl(tmp_path / "corpus.jsonl", prose_docs)
    common = {"data.source": str(src), "data.val_tokens": 2000, "data.shard_size": 8192,
              "runtime.tokenize_part_tokens": 3000}
    clean = prepare.prepare_data(smoke_config(**common, **{"runtime.work_dir": str(tmp_path / "w1")}),
                                 show_progress=False)

    config = resolve_config("smoke", {**common, "runtime.work_dir": str(tmp_path / "w2")}, root=str(tmp_path / "r2"))
    calls = []

    def crash_after_some_parts(docs, tokens, total):
        calls.append(tokens)
        if tokens > 20_000:
            raise KeyboardInterrupt  # the closest in-process stand-in for a kill

    source = download_source(config)
    with pytest.raises(KeyboardInterrupt):
        tokenize_source(config, source, crash_after_some_parts, show_progress=False)
    parts = sorted(layout.data_step_dir(config, "tokenize").glob("part_*.json"))
    assert parts, "no part was sealed before the crash"
    resumed = prepare.prepare_data(config, show_progress=False)
    a, b = load_manifest(clean.manifest), load_manifest(resumed.manifest)
    assert [(e.path, e.sha256) for e in a.shards] == [(e.path, e.sha256) for e in b.shards]


def test_bad_inputs_name_the_problem(smoke_config, tmp_path, prose_docs):
    with pytest.raises(sources.SourceError, match="no files match"):
        prepare.prepare_data(smoke_config(**{"data.source": str(tmp_path / "nothing-*.jsonl")}), show_progress=False)
    with pytest.raises(sources.SourceError, match="unknown built-in"):
        prepare.prepare_data(smoke_config(**{"data.source": "builtin:nope"}), show_progress=False)
    src = write_jsonl(tmp_path / "c.jsonl", [{"content": "x"}] * 3)
    with pytest.raises(sources.SourceError, match="no field 'text'.*content"):
        prepare.prepare_data(smoke_config(**{"data.source": str(src)}), show_progress=False)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises((EmptyCorpusError, sources.SourceError)):
        prepare.prepare_data(smoke_config(**{"data.source": str(empty)}), show_progress=False)


def test_unwritable_root_is_named(smoke_config, tmp_path):
    # A root below a regular file cannot be created, even by root.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    config = resolve_config("smoke", {"runtime.work_dir": str(tmp_path / "w")}, root=str(blocker / "root"))
    with pytest.raises(StorageError, match=str(blocker)):
        prepare.prepare_data(config, show_progress=False)


def test_corrupt_shard_is_named(smoke_config):
    result = prepare.prepare_data(smoke_config(), show_progress=False)
    manifest = load_manifest(result.manifest)
    victim = local_path(layout.shard(result.manifest, manifest.shards[1].path))
    data = bytearray(victim.read_bytes())
    data[2000] ^= 0xFF
    victim.write_bytes(bytes(data))
    verify_manifest(result.manifest)  # sizes and headers still fine
    with pytest.raises(ShardError, match=victim.name):
        verify_manifest(result.manifest, checksum=True)
    victim.write_bytes(bytes(data[:-10]))
    with pytest.raises(ShardError, match=victim.name):
        verify_manifest(result.manifest)
    with pytest.raises(ShardError, match=victim.name):
        read_shard(victim)


def test_split_sizes_val_first_then_train(smoke_config):
    config = smoke_config(**{"data.val_tokens": 2500, "data.shard_size": 1024})
    plan = split_sizes(config, 10_000)
    assert [s for s, _ in plan[:3]] == ["val"] * 3 and sum(n for s, n in plan if s == "val") == 2500
    assert sum(n for _, n in plan) == 10_000 and all(n <= 1024 for _, n in plan)


def test_worker_pool_gives_the_same_stream_in_order(prose_docs):
    from gpt2.data.tokenize_pool import tokenize_stream

    batches = [[d["text"] for d in prose_docs[i:i + 37]] for i in range(0, 600, 37)]
    serial = list(tokenize_stream(batches, num_workers=1))
    pooled = list(tokenize_stream(iter(batches), num_workers=2, window=3))
    assert [n for n, _ in pooled] == [len(b) for b in batches]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(serial, pooled))
