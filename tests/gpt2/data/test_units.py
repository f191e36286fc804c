"""Work units give the shards the data stage gave before units existed, for
any number of worker processes: the sha256 of every shard below was recorded
with the batch-streaming tokenizer (datasets + one pool) that units replaced.
Also: the limits stop the handing out of units early, and an executor that
writes elsewhere (a memory:// directory) has its parts fetched and checked."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from gpt2.config.data import builtin_digest
from gpt2.config.overrides import resolve_config
from gpt2.data.download import download_source
from gpt2.data.shard import shard_tokens
from gpt2.data.tokenize import tokenize_source
from gpt2.data.unit_pool import UnitPool
from gpt2.data.units import plan_units, tokenize_unit
from gpt2.data.work_unit import Unit, UnitResult
from gpt2.root import layout, storage
from gpt2.tokenizer import EOT_TOKEN
from tests.tiers import scenario

PYDOC_DIGEST = "42013c0f9d9218e4"
"""builtin_digest of the Python docs the hashes below were recorded with."""

# (documents, tokens, sha256 over "path:sha256\n" of every shard), recorded
# before units. Documents under data.max_tokens differ on purpose: they used
# to count whole batches of 256 documents, now exactly the documents whose
# <|endoftext|> is in the stream (checked below).
RECORDED = {
    "builtin": (79, 139016, "a912309a51546fe650f39e34386f0ba9"),
    "builtin-max-tokens": (79, 54321, "c97d8c049a88a5bb0aa25ba009cd4abb"),
    "jsonl": (1987, 132304, "44a1a1a360e396c92bae0f62a6498a60"),
    "jsonl-max-documents": (333, 18669, "a128b747123b05bf7a702ebdc055338e"),
    "jsonl-max-tokens": (768, 40001, "d8d191185fa663195b353f40cb34c55b"),
    "parquet": (1987, 132304, "44a1a1a360e396c92bae0f62a6498a60"),
    "parquet-max-documents": (100, 4839, "25f6a6f356a0bf0a36625121b31cada6"),
    "parquet-max-tokens": (768, 33333, "a421aa9b5e5633bea8db020721cdb24f"),
}


def prose() -> list[str]:
    from pydoc_data.topics import topics

    return [p for key in sorted(topics) for p in topics[key].split("\n\n") if len(p.strip()) > 40]


def build_sources(tmp: Path) -> dict[str, dict]:
    """Four JSONL files (one of a single line) and two parquet files of
    37-row groups, of the same ~2,000 documents; overrides per case."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = prose()
    (tmp / "jsonl").mkdir(parents=True)
    for i, (a, b) in enumerate([(0, 170), (170, 171), (171, 420), (420, len(docs))]):
        with open(tmp / "jsonl" / f"part-{i}.jsonl", "w", encoding="utf-8") as f:
            for j, t in enumerate(docs[a:b]):
                f.write(json.dumps({"id": a + j, "text": t}, ensure_ascii=False) + "\n")
    (tmp / "pq").mkdir()
    for i, (a, b) in enumerate([(0, 300), (300, len(docs))]):
        pq.write_table(pa.table({"body": docs[a:b], "n": list(range(a, b))}), tmp / "pq" / f"{i}.parquet",
                       row_group_size=37)
    small = {"data.shard_size": 8192, "data.val_tokens": 3000, "runtime.tokenize_part_tokens": 3000}
    jsonl = {**small, "data.source": str(tmp / "jsonl")}
    parquet = {**small, "data.source": f"file://{tmp}/pq/*.parquet", "data.text_field": "body"}
    return {
        "builtin": {"data.shard_size": 20_000},
        "builtin-max-tokens": {"data.shard_size": 20_000, "data.max_tokens": 54_321},
        "jsonl": jsonl,
        "jsonl-max-documents": {**jsonl, "data.max_documents": 333},
        "jsonl-max-tokens": {**jsonl, "data.max_tokens": 40_001},
        "parquet": parquet,
        "parquet-max-documents": {**parquet, "data.max_documents": 100},
        "parquet-max-tokens": {**parquet, "data.max_tokens": 33_333},
    }


def shards_digest(entries) -> str:
    return hashlib.sha256("".join(f"{e.path}:{e.sha256}\n" for e in entries).encode()).hexdigest()[:32]


def stream_of(tok) -> np.ndarray:
    return np.concatenate([np.fromfile(Path(tok.directory) / p, dtype=np.uint16) for p in tok.parts])


@pytest.mark.parametrize("workers", [1, 2, 3])
@scenario
def test_shards_are_the_ones_recorded_before_units_for_any_worker_count(tmp_path, workers):
    if builtin_digest("builtin:python-docs") != PYDOC_DIGEST:
        pytest.skip("this Python ships other pydoc topics than the ones the hashes were recorded with")
    for name, overrides in build_sources(tmp_path / "src").items():
        config = resolve_config("smoke", {**overrides, "runtime.work_dir": str(tmp_path / name / f"w{workers}")},
                                root=str(tmp_path / name / "root"))
        directory = layout.data_step_dir(config, "tokenize")
        tok = tokenize_source(config, download_source(config), show_progress=False,
                              executor=UnitPool(config, directory, workers))
        documents, tokens, digest = RECORDED[name]
        assert (tok.tokens, shards_digest(shard_tokens(config, tok).shards)) == (tokens, digest), name
        if "max-tokens" in name:
            assert tok.documents == int(np.count_nonzero(stream_of(tok) == EOT_TOKEN)) < documents, name
        else:
            assert tok.documents == documents, name
        assert len(tok.parts) > 1 or name.startswith("builtin-max"), name


def test_limits_stop_handing_out_units(tmp_path):
    """A 1,000-token trial of a corpus of ~400 units tokenizes a handful of them."""
    src = tmp_path / "big.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for t in prose() * 3:
            f.write(json.dumps({"text": t}) + "\n")
    overrides = {"data.source": str(src), "runtime.tokenize_part_tokens": 1000, "runtime.work_dir": str(tmp_path / "w")}
    for limit in ({"data.max_tokens": 1000}, {"data.max_documents": 20}):
        config = resolve_config("smoke", {**overrides, **limit}, root=str(tmp_path / "root"))
        source = download_source(config)
        units = plan_units(source, 1000)
        directory = layout.data_step_dir(config, "tokenize")
        tok = tokenize_source(config, source, show_progress=False, executor=UnitPool(config, directory, 2))
        assert (tok.tokens == 1000) if "data.max_tokens" in limit else (tok.documents == 20)
        written = list(directory.glob("part_*.json"))
        assert len(units) > 300 and len(written) <= 4 * 2 + len(tok.parts)  # the pool's window, no more


class MemoryExecutor:
    """Runs units in this process, writing to a memory:// directory, as a
    cluster writes to a bucket; `damage` flips a byte of one unit's part."""

    def __init__(self, config, directory: str, damage: int | None = None):
        self.config, self.directory, self.damage = config, directory, damage

    def map(self, units: Iterable[Unit]) -> Iterator[UnitResult]:
        for unit in reversed(list(units)):  # out of order on purpose
            result = tokenize_unit(self.config, unit, self.directory)
            if unit.index == self.damage:
                url = storage.join(self.directory, result.name)
                data = bytearray(storage.read_bytes(url))
                data[0] ^= 1
                storage.write_bytes_atomic(url, bytes(data))
            yield result


def test_an_executor_writing_elsewhere_has_its_parts_fetched_and_checked(tmp_path):
    overrides = build_sources(tmp_path / "src")["jsonl-max-documents"]

    def config_in(work: str):
        return resolve_config("smoke", {**overrides, "runtime.work_dir": str(tmp_path / work)},
                              root=str(tmp_path / "root"))

    expected = tokenize_source(config_in("here"), download_source(config_in("here")), show_progress=False)
    config = config_in("there")
    with pytest.raises(OSError, match="does not match its record's sha256"):
        tokenize_source(config, download_source(config), show_progress=False,
                        executor=MemoryExecutor(config, "memory://units-test/bad", damage=0))
    tok = tokenize_source(config, download_source(config), show_progress=False,
                          executor=MemoryExecutor(config, "memory://units-test/good"))
    assert Path(tok.directory) == layout.data_step_dir(config, "tokenize")
    assert (tok.documents, tok.tokens, tok.parts) == (expected.documents, expected.tokens, expected.parts)
    assert np.array_equal(stream_of(tok), stream_of(expected))
