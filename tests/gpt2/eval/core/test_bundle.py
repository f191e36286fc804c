"""The CORE bundle as cached data: fetched once into the root from a directory or a zip (sha256
recorded, every task's file checked), and every bad input refused in one line that names the
bundle and the task."""

from __future__ import annotations

import hashlib

import pytest

from gpt2.config.overrides import ConfigError, resolve_config
from gpt2.eval.core.bundle import CoreBundleError, select
from gpt2.eval.core.fetch import RECORD, fetch, fetched_tasks, read_file
from tests.gpt2.eval.core.tiny_bundle import CORE_YAML, FILES, write_bundle, zip_bundle


def _root(tmp_path) -> str:
    return f"file://{tmp_path}/root"


def test_a_zip_is_fetched_once_with_its_sha256_and_read_from_the_copy(tmp_path):
    bundle = zip_bundle(write_bundle(tmp_path / "b"), tmp_path / "eval_bundle.zip")
    record = fetch(_root(tmp_path), str(bundle))
    assert record["sha256"] == hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert set(record["files"]) == {"core.yaml", "eval_meta_data.csv", *(f"eval_data/{k}" for k in FILES)}
    bundle.unlink()  # the source is gone: the root's copy answers
    again = fetch(_root(tmp_path), str(bundle))
    assert again == record and [t.label for t in fetched_tasks(again)] == ["animal_mc", "animal_schema", "animal_lm"]


def test_a_damaged_copy_is_named(tmp_path):
    record = fetch(_root(tmp_path), str(write_bundle(tmp_path / "b")))
    path = tmp_path / "root" / record["dir"].split("/root/", 1)[1] / "eval_data" / "lm.jsonl"
    path.write_text('{"context": "x", "continuation": "y"}\n')
    with pytest.raises(CoreBundleError, match=r"eval_data/lm.jsonl is missing or damaged .*delete .* to fetch"):
        read_file(record, "eval_data/lm.jsonl")


def test_a_fetch_torn_before_its_record_is_done_again_from_the_source(tmp_path):
    """A fetch killed part way leaves files but no bundle.json (written last): the next fetch copies
    the bundle again, so a file left half written, here one flipped byte, is replaced, not trusted."""
    source = write_bundle(tmp_path / "b")
    record = fetch(_root(tmp_path), str(source))
    copy = tmp_path / "root" / record["dir"].split("/root/", 1)[1]
    (copy / RECORD).unlink()
    torn = copy / "eval_data" / "mc" / "animals.jsonl"
    data = bytearray(torn.read_bytes())
    data[len(data) // 2] ^= 0x01
    torn.write_bytes(bytes(data))
    again = fetch(_root(tmp_path), str(source))
    assert again == record and (copy / RECORD).exists()
    original = (source / "eval_data" / "mc" / "animals.jsonl").read_bytes()
    assert read_file(again, "eval_data/mc/animals.jsonl") == original


@pytest.mark.parametrize(("break_it", "message"), [
    (lambda d: (d / "core.yaml").unlink(), r"CORE bundle \S+ has no core.yaml: give eval.core_bundle"),
    (lambda d: (d / "eval_data" / "schema.jsonl").unlink(),
     r"CORE bundle \S+, task animal_schema: eval_data/schema.jsonl is missing; the bundle is incomplete"),
    (lambda d: (d / "core.yaml").write_text(CORE_YAML.replace("icl_task_type: schema", "icl_task_type: ranking")),
     r"CORE bundle \S+, task animal_schema: unknown icl_task_type 'ranking'; known: multiple_choice, schema"),
    (lambda d: (d / "eval_meta_data.csv").write_text("Eval Task,Random baseline\nanimal_mc,25\n"),
     r"CORE bundle \S+, task animal_schema: eval_meta_data.csv has no random baseline for it"),
])
def test_a_bad_bundle_is_refused_by_name_before_anything_is_written(tmp_path, break_it, message):
    bundle = write_bundle(tmp_path / "b")
    break_it(bundle)
    for source in (bundle, zip_bundle(bundle, tmp_path / "b.zip")):
        with pytest.raises(CoreBundleError, match=message) as err:
            fetch(_root(tmp_path), str(source))
        assert "\n" not in str(err.value)
    assert not list((tmp_path / "root").rglob(RECORD))


def test_a_bundle_that_is_not_there_is_named(tmp_path):
    with pytest.raises(CoreBundleError, match=r"CORE bundle memory://nowhere/eval_bundle.zip does not exist"):
        fetch(_root(tmp_path), "memory://nowhere/eval_bundle.zip")


def test_an_unknown_core_label_is_refused_with_the_closest_names(tmp_path):
    tasks = fetched_tasks(fetch(_root(tmp_path), str(write_bundle(tmp_path / "b"))))
    assert [t.label for t in select(tasks, ["animal_lm"], "b")] == ["animal_lm"]
    with pytest.raises(CoreBundleError, match=r"core:animal_shema is not a task of CORE bundle b; closest: "
                                              r"core:animal_schema"):
        select(tasks, ["animal_shema"], "b")


@pytest.mark.parametrize("text", ["[hellaswag,core]", "hellaswag,core", '["hellaswag", "core"]'])
def test_eval_tasks_parse_as_written_on_the_command_line(text):
    assert resolve_config("smoke", [f"eval.tasks={text}"]).eval.tasks == ("hellaswag", "core")


def test_an_unknown_task_kind_is_refused_with_the_closest_form():
    with pytest.raises(ConfigError, match=r"unknown task 'lm-evl:piqa' \(did you mean lm-eval:piqa\?\)"):
        resolve_config("smoke", ["eval.tasks=hellaswag,lm-evl:piqa"])
    with pytest.raises(ConfigError, match=r"unknown task 'cor' \(did you mean core\?\)"):
        resolve_config("smoke", ["eval.tasks=cor"])
