"""eval.core_every: CORE scored in the training loop from the bundle the launcher fetched into the
root. A tiny run logs core/score at the steps it is due and at the last, the same number the
evaluate stage gives its last checkpoint; a run without the key logs no CORE; a training
process whose bundle was never fetched is refused in one line before its first step; the key
never renames a run."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from gpt2.checkpoint.ref import resolve_checkpoint
from gpt2.config.identity import eval_fingerprint
from gpt2.eval.core.bundle import CoreBundleError, parse_tasks
from gpt2.eval.core.prompts import examples, subsample
from gpt2.eval.evaluate import evaluate_checkpoint
from gpt2.launch.torchrun import train_stage
from gpt2.root import layout, storage
from gpt2.tokenizer import get_encoding
from gpt2.tracking.store import default_tracking_uri
from gpt2.train.run import train
from tests.gpt2.eval.core.tiny_bundle import CORE_YAML, FILES, META, write_bundle
from tests.gpt2.train.fixtures import tiny_config, write_dataset

pytestmark = pytest.mark.xdist_group("core_in_loop")

IN_LOOP_CORE = {"eval.core_every": 3, "eval.max_per_task": 4}  # steps 3, 6 and the last, 8


def _history(config, run_id: str, metric: str) -> list[tuple[int, float]]:
    client = MlflowClient(default_tracking_uri(config))
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)]


def test_a_run_with_core_every_logs_core_at_its_steps_and_one_without_logs_none(tmp_path):
    root = tmp_path / "root"
    config = tiny_config(root, **IN_LOOP_CORE, **{"eval.core_bundle": str(write_bundle(tmp_path / "bundle"))})
    write_dataset(config)
    # The key is no part of the run's identity: the same name as without it.
    assert layout.run_name(config) == layout.run_name(tiny_config(root))
    result = train_stage(config)  # the launcher: fetches the bundle into the root, then trains in this process
    core = _history(config, result.mlflow_run_id, "core/score")
    assert [step for step, _ in core] == [3, 6, 8]
    for label in ("animal_mc", "animal_schema", "animal_lm"):
        accs = _history(config, result.mlflow_run_id, f"core/{label}/acc")
        assert [s for s, _ in accs] == [3, 6, 8] and all(0 <= v <= 1 for _, v in accs)
    # The last step's CORE is the evaluate stage's on the last checkpoint: the same items, the same picks.
    evaluated = evaluate_checkpoint(config.model_copy(update={"eval": config.eval.model_copy(
        update={"tasks": ("core",)})}), resolve_checkpoint(config, "latest"))
    assert core[-1][1] == pytest.approx(evaluated["core"]["score"], abs=1e-9)

    plain = tiny_config(root, **{"train.max_steps": 4})
    again = train(plain)
    assert _history(plain, again.mlflow_run_id, "core/score") == []
    assert _history(plain, again.mlflow_run_id, "val/loss") != []  # it did log what it logs


def test_a_bundle_not_in_the_root_is_refused_in_one_line_before_the_first_step(tmp_path):
    bundle = write_bundle(tmp_path / "bundle")
    config = tiny_config(tmp_path / "root", **IN_LOOP_CORE, **{"eval.core_bundle": str(bundle)})
    write_dataset(config)
    with pytest.raises(CoreBundleError) as err:
        train(config)  # the training process itself (python -m gpt2.train): it never fetches
    message = str(err.value)
    assert "\n" not in message and "eval.core_every=3" in message and str(bundle) in message
    assert "gpt2 train" in message and "eval.core_every=0" in message
    assert not storage.exists(layout.run_dir(config))  # no lease, checkpoint or MLflow run: refused first


def test_the_key_enters_no_fingerprint():
    config = tiny_config("memory://fp")
    changed = tiny_config("memory://fp", **{"eval.core_every": 100})
    assert layout.run_name(changed) == layout.run_name(config)
    assert eval_fingerprint(changed, "0" * 64) == eval_fingerprint(config, "0" * 64)


def test_each_ranks_share_holds_the_items_and_few_shot_draws_one_process_scores():
    """Items split over ranks as HellaSwag's in-loop items are: every item renders as it does when
    one process scores them all (its few-shot draws come from the whole cut), so the sum is the same."""
    enc = get_encoding("gpt2")
    for task in parse_tasks(CORE_YAML, META, "tiny"):
        items = subsample(FILES[task.dataset_uri], 8)
        whole = examples(task, items, enc, 32)
        shares = [examples(task, items, enc, 32, only=range(rank, len(items), 3)) for rank in range(3)]
        assert [shares[i % 3][i // 3] for i in range(len(items))] == whole
