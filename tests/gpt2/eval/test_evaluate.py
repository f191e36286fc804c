"""The evaluate stage's work on a checkpoint with eval.tasks beyond HellaSwag: CORE from a local
bundle (each task and the score, in the result file), an evaluation that resumes without
rescoring a finished task, and `lm-eval:<task>` on a local lm-eval YAML task giving lm-eval's own
numbers for the export (`lm-eval --model hf`)."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2.checkpoint.ref import resolve_checkpoint
from gpt2.checkpoint.store import save_checkpoint
from gpt2.config.identity import eval_fingerprint, fingerprint
from gpt2.eval.evaluate import evaluate_checkpoint
from gpt2.eval.harness.run import LmEvalTaskError, find_task, indexed_names, run_task, task_manager
from gpt2.export.hf import write_hf_dir
from gpt2.model import GPT
from gpt2.root import layout, storage
from tests.gpt2.eval.core.tiny_bundle import MC, write_bundle

pytestmark = pytest.mark.xdist_group("eval_stage")


def _checkpoint(config):
    torch.manual_seed(5)
    model = GPT(config.model)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(20)
    save_checkpoint(layout.checkpoint_dir(layout.run_dir(config), 4), model, torch.optim.AdamW(model.parameters()),
                    {"step": 4, "config": config.model_dump(mode="json")}, {})
    return resolve_checkpoint(config, "latest"), model


def test_core_in_the_result_and_a_rerun_keeps_finished_tasks(smoke_config, tmp_path):
    bundle = write_bundle(tmp_path / "bundle")
    config = smoke_config(**{"eval.tasks": "core", "eval.core_bundle": str(bundle), "train.max_steps": 4})
    ref, _ = _checkpoint(config)
    result = evaluate_checkpoint(config, ref)
    assert result["hellaswag"] is None and set(result["tasks"]) == {"core:animal_mc", "core:animal_schema",
                                                                    "core:animal_lm"}
    centered = [t["centered"] for t in result["tasks"].values()]
    assert result["core"]["score"] == pytest.approx(sum(centered) / 3) and result["core"]["tasks"] == 3
    assert storage.read_json(result["result_url"])["core"] == result["core"]

    # Preempted after two tasks: the third is scored again, the two kept are read back as they are.
    kept = {p.stem: p for p in (tmp_path / "root").rglob("core_animal_*.json")}
    assert set(kept) == {"core_animal_mc", "core_animal_schema", "core_animal_lm"}
    marked = {**json.loads(kept["core_animal_mc"].read_text()), "acc": 0.123}
    kept["core_animal_mc"].write_text(json.dumps(marked))
    kept["core_animal_lm"].unlink()
    again = evaluate_checkpoint(config, ref)
    assert again["tasks"]["core:animal_mc"]["acc"] == 0.123
    rescored, first = (dict(r["tasks"]["core:animal_lm"]) for r in (again, result))
    assert rescored.pop("items_per_s") != first.pop("items_per_s") and rescored == first


def test_the_default_evaluations_cache_key_is_unchanged(smoke_config):
    """Keys added for eval.tasks are left out at their defaults: evaluations cached before them stay valid."""
    config = smoke_config()
    before = fingerprint({"weights": "w", "format": 1, "eval": {k: getattr(config.eval, k) for k in (
        "hellaswag_source", "limit", "every_steps", "batch_size")}})
    assert eval_fingerprint(config, "w") == before
    assert eval_fingerprint(smoke_config(**{"eval.tasks": "hellaswag,core"}), "w") != before


TASK_YAML = """task: tiny_animals
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: {data}
validation_split: validation
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_an_lm_eval_task_from_a_local_yaml_gives_lm_evals_own_numbers_for_the_export(smoke_config, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tasks / "animals.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in MC))
    (tasks / "tiny_animals.yaml").write_text(TASK_YAML.format(data=data))
    config = smoke_config(**{"eval.tasks": "lm-eval:tiny_animals", "eval.lm_eval_include": str(tasks),
                             "train.max_steps": 4})
    ref, model = _checkpoint(config)
    ours = evaluate_checkpoint(config, ref)["tasks"]["lm-eval:tiny_animals"]
    hf_dir = write_hf_dir(model.state_dict(), model.config, tmp_path / "hf")
    theirs = run_task("hf", "tiny_animals", tasks, defaults=False,
                      model_args={"pretrained": str(hf_dir), "device": "cpu", "dtype": "float32"})
    assert ours["n"] == theirs["n"] == len(MC)
    assert ours["acc"] == theirs["metrics"]["acc"] and ours["acc_stderr"] == pytest.approx(theirs["metrics"]["acc_stderr"])
    with pytest.raises(LmEvalTaskError, match=r"lm-eval:tiny_animal is not an lm-eval task .*closest: tiny_animals"):
        find_task("tiny_animal", tasks)


def test_lm_evals_task_names_are_indexed_once_and_again_when_a_task_file_or_the_list_changes(
        tmp_path, monkeypatch, caplog):
    """indexed_names, as default_task_names uses it for lm-eval's own 14k task files, here on a
    folder of two: a typo's refusal reads the kept list instead of indexing them again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tasks / "animals.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in MC))
    (tasks / "tiny_animals.yaml").write_text(TASK_YAML.format(data=data))
    calls = []

    def index():
        calls.append(1)
        return task_manager(tasks, defaults=False).all_tasks

    assert indexed_names(tasks, "label", index) == ["tiny_animals"] and len(calls) == 1
    assert indexed_names(tasks, "label", index) == ["tiny_animals"] and len(calls) == 1  # kept
    (kept,) = (tmp_path / "cache" / "gpt2-pipeline").glob("label-tasks-*.json")

    # A task file added (or edited: its size or time changes) is a new list.
    (tasks / "tiny_animals_2.yaml").write_text(TASK_YAML.format(data=data).replace("tiny_animals", "tiny_animals_2"))
    assert indexed_names(tasks, "label", index) == ["tiny_animals", "tiny_animals_2"] and len(calls) == 2

    # One changed byte in a kept list (a name that still parses) is caught and the list made again.
    (tasks / "tiny_animals_2.yaml").unlink()
    kept.write_text(kept.read_text().replace("tiny_animals", "tiny_animalz"))
    assert indexed_names(tasks, "label", index) == ["tiny_animals"] and len(calls) == 3
    assert "damaged" in caplog.text
    assert indexed_names(tasks, "label", index) == ["tiny_animals"] and len(calls) == 4  # made again...
    assert indexed_names(tasks, "label", index) == ["tiny_animals"] and len(calls) == 4  # ...and kept
