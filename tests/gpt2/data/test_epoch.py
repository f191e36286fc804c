"""`train.max_steps=epoch`: one pass over the prepared train split, resolved
from its manifest, and what `gpt2 plan` says before the data stage has run."""

from __future__ import annotations

import pytest

from gpt2.config.identity import train_fingerprint
from gpt2.cost.plan import make_plan
from gpt2.data.epoch import EpochUnknown, planned_steps, resolve_max_steps, with_resolved_steps
from gpt2.root import layout, storage
from tests.gpt2.train.fixtures import tiny_config, write_dataset


def test_a_number_is_itself(tmp_path):
    config = tiny_config(tmp_path)
    assert resolve_max_steps(config) == 8 and with_resolved_steps(config) is config


def test_epoch_is_the_train_tokens_over_the_global_batch(tmp_path):
    config = tiny_config(tmp_path, **{"train.max_steps": "epoch"})
    write_dataset(config, train_shards=2, shard_tokens=4096 + 100)  # the tail short of a batch is dropped
    assert resolve_max_steps(config) == 2 * (4096 + 100) // 256 == 32
    resolved = with_resolved_steps(config)
    assert resolved.train.max_steps == 32 and resolved.train.lr == config.train.lr
    # The same run as one given that number by hand: evaluate and export find it.
    by_hand = tiny_config(tmp_path, **{"train.max_steps": 32})
    assert train_fingerprint(resolved) == train_fingerprint(by_hand)
    assert layout.run_dir(resolved) == layout.run_dir(by_hand)


def test_epoch_without_a_manifest_says_to_run_the_data_stage(tmp_path):
    config = tiny_config(tmp_path, **{"train.max_steps": "epoch"})
    with pytest.raises(EpochUnknown, match="gpt2 prepare") as err:
        resolve_max_steps(config)
    assert "train.max_steps=N" in str(err.value) and layout.manifest(config) in str(err.value)
    assert with_resolved_steps(config, required=False) is config  # when the run's name is not needed


def test_a_split_smaller_than_one_batch_is_refused(tmp_path):
    config = tiny_config(tmp_path, **{"train.max_steps": "epoch", "train.total_batch_tokens": 8192})
    write_dataset(config, train_shards=1, shard_tokens=4096)
    with pytest.raises(EpochUnknown, match=r"4,096 tokens, less than one global batch \(train.total_batch_tokens=8,192"):
        resolve_max_steps(config)


def test_plan_uses_the_manifest_or_names_its_assumption(tmp_path):
    config = tiny_config(tmp_path, **{"train.max_steps": "epoch"})
    steps, source, note = planned_steps(config)
    assert source == "assumed" and "unknown until the data stage has run" in note
    assert steps == 10_000_000_000 // 256
    capped = tiny_config(tmp_path, **{"train.max_steps": "epoch", "data.max_tokens": 8192 + 2560})
    assert capped.data.val_tokens == 8192 and planned_steps(capped)[0] == 2560 // 256  # less the val split

    write_dataset(config, train_shards=1, shard_tokens=2048)
    plan = make_plan(config, "H100")
    assert (plan["steps"], plan["steps_from"], plan["tokens"]) == (8, "manifest", 8 * 256)
    assert storage.exists(layout.manifest(config)) and layout.manifest(config) in plan["steps_note"]
    assert make_plan(tiny_config(tmp_path), "H100")["steps_from"] == "set"


def test_the_trainer_command_resolves_epoch(tmp_path, capsys):
    import json

    from gpt2.train.__main__ import main
    from tests.gpt2.train.fixtures import write_run_json

    config = tiny_config(tmp_path, **{"train.max_steps": "epoch", "tracking.enabled": False})
    run_json = write_run_json(config, tmp_path / "run.json")
    assert main(["--config", str(run_json)]) == 1  # no data yet: refused, saying what to do
    write_dataset(config, train_shards=1, shard_tokens=6 * 256)
    assert main(["--config", str(run_json)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["steps"] == 6 and result["checkpoint"].endswith("step_000006")
