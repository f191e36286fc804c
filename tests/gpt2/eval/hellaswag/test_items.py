"""HellaSwag data: lm-eval's preprocessing on tricky rows, and bad input."""

from __future__ import annotations

import json

import datasets
import fsspec
import pytest
from lm_eval.tasks.hellaswag import utils as lm_eval_hellaswag

from gpt2.eval.hellaswag.items import (
    FORMAT_SAMPLE,
    HellaSwagDataError,
    Item,
    load_items,
    load_rows,
    preprocess,
)
from gpt2.eval.hellaswag.scorer import judge
from gpt2.eval.logprobs import ContinuationScore


def row(**fields):
    base = {"activity_label": "Cooking", "ctx_a": "A man cracks an egg.", "ctx_b": "he",
            "endings": ["fries it.", "eats the shell.", "throws it.", "sings."], "label": 0}
    return {**base, **fields}


def test_format_sample_is_labelled_and_covers_the_format():
    rows = load_rows(FORMAT_SAMPLE)
    assert 20 <= len(rows) <= 40
    assert {r["split_type"] for r in rows} == {"format-sample"}
    assert {int(r["label"]) for r in rows} == {0, 1, 2, 3}
    text = json.dumps(rows, ensure_ascii=False)
    assert "[title]" in text and "[header]" in text and "[substeps]" in text
    assert any(r["ctx_b"] == "" for r in rows)
    assert any(len(e) != len(e.encode()) for r in rows for e in r["endings"])


def test_items_equal_lm_evals_process_docs_on_every_sample_row():
    rows = load_rows(FORMAT_SAMPLE)
    docs = lm_eval_hellaswag.process_docs(datasets.Dataset.from_list(rows))
    ours = [Item.from_row(r) for r in rows]
    assert [(i.query, list(i.endings), i.label) for i in ours] == [
        (d["query"], d["choices"], d["gold"]) for d in docs
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[header] How to fold a crane [title] Start with paper. [step] Fold it.", " How to fold a crane. Start with paper. Fold it."),
        ("[substeps] Scrub it.", " Scrub it."),  # the leading space stays, as in lm-eval
        ("Go to the store. [step]", "Go to the store. "),
        ("a  b", "a b"),
        ("Zoë’s crème brûlée — 二胡 🚀", "Zoë’s crème brûlée — 二胡 🚀"),
    ],
)
def test_preprocess_matches_lm_eval(text, expected):
    assert preprocess(text) == lm_eval_hellaswag.preprocess(text) == expected


def test_query_joins_activity_label_and_capitalized_ctx_b():
    assert Item.from_row(row(ctx_b="he PUTS")).query == "Cooking: A man cracks an egg. He puts"
    # Empty ctx_b (WikiHow rows): the joining space is stripped ...
    assert Item.from_row(row(ctx_b="")).query == "Cooking: A man cracks an egg."
    # ... but one left by a removed trailing [step] stays (lm-eval moves it onto the ending).
    assert Item.from_row(row(ctx_a="Wash it. [step]", ctx_b="")).query == "Cooking: Wash it. "


def test_acc_norm_divides_by_characters_not_bytes():
    # Ending 0 has 5 characters but 10 bytes. Per character: -1.2 vs -1.1, so
    # ending 1 wins (lm-eval); per byte it would be -0.6 vs -1.1, ending 0.
    item = Item(query="q", endings=("ééééé", "abcd", "x", "y"), label=0)
    scores = [ContinuationScore(-6.0, 3, False), ContinuationScore(-4.4, 2, False),
              ContinuationScore(-9.0, 1, False), ContinuationScore(-9.0, 1, False)]
    judged = judge(item, scores)
    assert (judged.pred, judged.pred_norm) == (1, 1)
    # Per token: -2.0 vs -2.2, so the llm.c variant picks ending 0.
    assert judged.pred_norm_per_token == 0


def test_malformed_row_error_names_the_line(tmp_path):
    path = tmp_path / "hs.jsonl"
    good = json.dumps(row())
    path.write_text(f"{good}\n{good}\n{{\"activity_label\": \"x\", \n{good}\n")
    with pytest.raises(HellaSwagDataError, match=r"hs.jsonl line 3: not valid JSON"):
        load_items(str(path))


def test_missing_fields_and_wrong_endings_are_reported_together(tmp_path):
    path = tmp_path / "hs.jsonl"
    bad = row(endings=["only", "three", "endings"])
    del bad["ctx_a"]
    path.write_text(json.dumps(row()) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(HellaSwagDataError, match=r"line 2: missing field 'ctx_a'; 'endings' must be a list of 4"):
        load_items(str(path))


@pytest.mark.parametrize("label", [4, -1, "7", "two", True])
def test_label_out_of_range_is_an_error(tmp_path, label):
    path = tmp_path / "hs.jsonl"
    path.write_text(json.dumps(row()) + "\n" + json.dumps(row(label=label)) + "\n")
    with pytest.raises(HellaSwagDataError, match=r"line 2: label .* out of range"):
        load_items(str(path))


def test_string_labels_as_on_the_hub_are_accepted(tmp_path):
    path = tmp_path / "hs.jsonl"
    path.write_text(json.dumps(row(label="3")) + "\n")
    assert load_items(str(path))[0].label == 3


def test_missing_file_and_unknown_builtin_are_clear_errors(tmp_path):
    with pytest.raises(HellaSwagDataError, match="does not exist"):
        load_items(str(tmp_path / "nope.jsonl"))
    with pytest.raises(HellaSwagDataError, match="unknown builtin"):
        load_items("builtin:hellaswag")


def test_any_fsspec_url_and_limit():
    with fsspec.open("memory://hs/val.jsonl", "w") as f:
        f.write("\n".join(json.dumps(row(label=i % 4)) for i in range(5)) + "\n")
    items = load_items("memory://hs/val.jsonl", limit=3)
    assert [i.label for i in items] == [0, 1, 2]
