"""The gpt2-124m-owt preset on a small parquet shaped like Skylion007/openwebtext
(one `text` column, several row groups): its val split holds exactly the
documents `datasets`' train_test_split(test_size=0.0005, seed=2357) gives
nanoGPT, in that order; train holds the others in source order; every
document once, each preceded by <|endoftext|> as llm.c writes it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpt2.config.overrides import resolve_config
from gpt2.config.presets import OPENWEBTEXT
from gpt2.data import prepare
from gpt2.data.doc_split import nanogpt_val_documents
from gpt2.tokenizer import EOT_TOKEN, get_encoding
from tests.gpt2.data.test_prepare import shards_of

N_DOCS = 4_001  # ceil(0.0005 x 4001) = 3 val documents


@pytest.fixture(scope="module")
def owt_parquet(tmp_path_factory):
    rng = np.random.default_rng(7)
    words = ["the", "open", "web", "text", "corpus", "reddit", "links", "news", "of", "a"]
    texts = [f"doc {i}: " + " ".join(rng.choice(words, rng.integers(3, 12))) for i in range(N_DOCS)]
    path = tmp_path_factory.mktemp("owt") / "data" / "train-00000-of-00001.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"text": texts}), path, row_group_size=500)
    return path, texts


def _documents(tokens: np.ndarray) -> list[str]:
    bounds = np.flatnonzero(tokens == EOT_TOKEN).tolist() + [len(tokens)]
    assert bounds[0] == 0  # every document preceded by <|endoftext|>
    enc = get_encoding()
    return [enc.decode(tokens[a + 1:b].tolist()) for a, b in zip(bounds, bounds[1:])]


def test_the_preset_reads_openwebtext_as_parquet_with_nanogpts_split():
    from gpt2.config.presets import PRESETS

    config = PRESETS["gpt2-124m-owt"]()
    assert config.data.source == OPENWEBTEXT and OPENWEBTEXT.endswith(".parquet")
    assert (config.data.val_split, config.data.source_format, config.data.text_field) == ("nanogpt", "auto", "text")
    base = PRESETS["gpt2-124m"]()  # llm.c's recipe otherwise unchanged
    assert (config.model, config.train, config.eval) == (base.model, base.train, base.eval)
    assert config.data.shard_size == base.data.shard_size


def test_val_is_the_documents_datasets_holds_out_for_nanogpt(owt_parquet, tmp_path):
    datasets = pytest.importorskip("datasets")
    path, texts = owt_parquet
    config = resolve_config("gpt2-124m-owt", {"data.source": str(path), "data.shard_size": 20_000,
                                              "runtime.work_dir": str(tmp_path / "work")}, root=str(tmp_path / "root"))
    result = prepare.prepare_data(config, show_progress=False)
    parts = shards_of(result)
    val = _documents(np.concatenate([t for s, t in parts if s == "val"]))
    train = _documents(np.concatenate([t for s, t in parts if s == "train"]))
    # nanoGPT's own call, on the same documents in the same order.
    split = datasets.Dataset.from_dict({"text": texts}).train_test_split(test_size=0.0005, seed=2357, shuffle=True)
    assert val == split["test"]["text"] and len(val) == 3
    held_out = set(nanogpt_val_documents(N_DOCS).tolist())
    assert train == [t for i, t in enumerate(texts) if i not in held_out]
    assert sorted(train) == sorted(split["train"]["text"])
    assert result.documents == N_DOCS and [s for s, _ in parts].count("train") > 1


def test_the_split_does_not_depend_on_how_the_source_is_cut(owt_parquet, tmp_path):
    path, texts = owt_parquet
    runs = []
    for name, part_tokens in (("one", 1 << 25), ("many", 2_000)):
        config = resolve_config("gpt2-124m-owt", {"data.source": str(path), "data.shard_size": 20_000,
                                                  "runtime.tokenize_part_tokens": part_tokens,
                                                  "runtime.work_dir": str(tmp_path / name)},
                                root=str(tmp_path / name / "root"))
        runs.append([(s, t.tobytes()) for s, t in shards_of(prepare.prepare_data(config, show_progress=False))])
    assert runs[0] == runs[1]
