"""Unit readers: every document read exactly once whatever the unit
boundaries, the same texts `datasets` streaming gives for every format, and
bad input named by file and line or row, also from a worker process."""

from __future__ import annotations

import gzip
import json

import pytest

from gpt2.config.overrides import resolve_config
from gpt2.data import sources
from gpt2.data.download import download_source
from gpt2.data.tokenize import tokenize_source
from gpt2.data.unit_pool import UnitPool
from gpt2.data.unit_readers import iter_text_batches
from gpt2.data.units import plan_units
from gpt2.root import layout


def read_all(source: sources.SourceFiles, field: str = "text", part_tokens: int = 1 << 25) -> list[str]:
    return [t for unit in plan_units(source, part_tokens) for batch in iter_text_batches(unit, field) for t in batch]


def resolved(url: str) -> sources.SourceFiles:
    return sources.resolve(resolve_config("smoke", {"data.source": url}).data)


def datasets_texts(source: sources.SourceFiles, field: str = "text") -> list[str]:
    """What the data stage read before units: `datasets` streaming."""
    from datasets import load_dataset

    kwargs = {"sample_by": "document"} if source.format == "text" else {}
    ds = load_dataset(source.format, data_files=list(source.files), split="train", streaming=True, **kwargs)
    return [row["text" if source.format == "text" else field] for row in ds]


def test_every_line_once_whatever_the_boundaries(tmp_path, prose_docs):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": d["text"]}, ensure_ascii=False) for d in prose_docs[:60]]
    path.write_text("\n".join(lines[:30]) + "\n\n" + "\n".join(lines[30:]) + "\n", encoding="utf-8")
    source = resolved(str(path))
    expected = [d["text"] for d in prose_docs[:60]]
    sizes = set()
    for part_tokens in (1, 7, 40, 333, 10**6):  # ranges of 3 bytes up to the whole file
        units = plan_units(source, part_tokens)
        sizes.add(len(units))
        assert [u.index for u in units] == list(range(len(units)))
        assert units[0].start == 0 and units[-1].stop == path.stat().st_size
        assert all(a.stop == b.start for a, b in zip(units, units[1:]))
        assert read_all(source, part_tokens=part_tokens) == expected
    assert len(sizes) == 5 and min(sizes) == 1


def test_same_texts_as_datasets_for_every_format(tmp_path, prose_docs):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [d["text"] for d in prose_docs[:80]] + ["ünïcödé ✓ — \u2028 line", "tab\there\r\nwindows"]
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "a.json").write_text(json.dumps([{"text": t, "n": i} for i, t in enumerate(docs)]))
    (tmp_path / "gz").mkdir()
    with gzip.open(tmp_path / "gz" / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in docs)
    (tmp_path / "txt").mkdir()
    for i, t in enumerate(docs[-12:]):
        (tmp_path / "txt" / f"{i:02d}.txt").write_bytes(t.encode())
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"body": docs}), tmp_path / "pq" / "a.parquet", row_group_size=9)
    cases = [("json", "text"), ("gz", "text"), ("txt", "text"), ("pq", "body")]
    for name, field in cases:
        source = resolved(str(tmp_path / name))
        ours = read_all(source, field, part_tokens=50)
        assert ours == datasets_texts(source, field), name
        assert len(ours) == (12 if name == "txt" else len(docs)), name
    assert len(plan_units(resolved(str(tmp_path / "pq")), 50)) > 2  # row groups make several units


def config_for(tmp_path, path, **overrides):
    return resolve_config("smoke", {"data.source": str(path), "runtime.work_dir": str(tmp_path / "w"),
                                    "runtime.tokenize_part_tokens": 200, **overrides}, root=str(tmp_path / "root"))


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_input_names_file_and_line_even_from_a_worker(tmp_path, prose_docs, workers):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": d["text"]}) for d in prose_docs[:200]]
    lines[150] = '{"text": "unterminated'
    path.write_text("\n".join(lines) + "\n")
    config = config_for(tmp_path, path)
    directory = layout.data_step_dir(config, "tokenize")
    assert len(plan_units(download_source(config), 200)) > 10  # line 151 is far from the first unit
    with pytest.raises(sources.SourceError, match=r"bad\.jsonl' line 151: not valid JSON"):
        tokenize_source(config, download_source(config), show_progress=False,
                        executor=UnitPool(config, directory, workers))


def test_non_text_values_name_the_row(tmp_path, prose_docs):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [d["text"] for d in prose_docs[:50]]
    texts[41] = None
    pq.write_table(pa.table({"text": texts}), tmp_path / "n.parquet", row_group_size=10)
    config = config_for(tmp_path, tmp_path / "n.parquet")
    with pytest.raises(sources.SourceError, match=r"non-text values \(row 41\)"):
        tokenize_source(config, download_source(config), show_progress=False)
    config = config_for(tmp_path, tmp_path / "n.parquet", **{"data.text_field": "body"})
    with pytest.raises(sources.SourceError, match=r"no field 'body'.*available fields: text"):
        tokenize_source(config, download_source(config), show_progress=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_read_remote_units_themselves(tmp_path, prose_docs, gcs_emulator, monkeypatch, workers):
    """A limited run streams a gs:// source: each worker reads its byte ranges
    from the bucket and the stream equals the one of the same file on disk."""
    import fsspec
    import numpy as np

    monkeypatch.setenv("FSSPEC_GCS_TOKEN", "anon")  # for worker processes, which do not share fsspec.config
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d["text"]}) + "\n" for d in prose_docs), encoding="utf-8")
    fsspec.filesystem("gcs").put_file(str(path), f"{gcs_emulator}/corpus.jsonl")
    streams = []
    for name, url in (("local", str(path)), ("remote", f"{gcs_emulator}/corpus.jsonl")):
        config = resolve_config("smoke", {"data.source": url, "data.max_documents": 400,
                                          "runtime.tokenize_part_tokens": 2000,
                                          "runtime.work_dir": str(tmp_path / name)}, root=str(tmp_path / "root"))
        source = download_source(config)
        assert source.files[0].startswith("gs://") == (name == "remote")  # streamed, not downloaded
        assert len(plan_units(source, 2000)) > 4
        tok = tokenize_source(config, source, show_progress=False,
                              executor=UnitPool(config, layout.data_step_dir(config, "tokenize"), workers))
        assert tok.documents == 400
        streams.append(np.concatenate([np.fromfile(f"{tok.directory}/{p}", dtype=np.uint16) for p in tok.parts]))
    assert np.array_equal(*streams)
