"""A sweep's members: the grid's Cartesian product, a runs file, each member resolved through
`gpt2 run`'s own path, and every bad member refused up front by its number and key."""

from __future__ import annotations

import json

import pytest

from gpt2.config.overrides import resolve_config
from gpt2.root import layout
from gpt2.sweep.groups import data_groups
from gpt2.sweep.members import (SweepError, expand_grid, member_sets, parse_grid, read_runs, resolve_members,
                                split_values)


def test_a_grid_is_the_cartesian_product_with_values_read_as_set_values():
    grid = parse_grid(["train.lr=3e-4,6e-4", "train.optimizer=adamw,muon", "data.source=builtin:tiny"])
    assert grid == {"train.lr": [3e-4, 6e-4], "train.optimizer": ["adamw", "muon"],
                    "data.source": ["builtin:tiny"]}
    cells = expand_grid(grid)
    assert len(cells) == 4
    assert [(c["train.lr"], c["train.optimizer"]) for c in cells] == [
        (3e-4, "adamw"), (3e-4, "muon"), (6e-4, "adamw"), (6e-4, "muon")]


def test_commas_inside_brackets_stay_in_one_value():
    assert split_values("[0.9,0.95],[0.9,0.99]") == ["[0.9,0.95]", "[0.9,0.99]"]
    assert parse_grid(["train.betas=[0.9,0.95],[0.9,0.99]"]) == {"train.betas": [[0.9, 0.95], [0.9, 0.99]]}


@pytest.mark.parametrize("bad,says", [("train.lr", "key=v1,v2"), ("=1,2", "key=v1,v2"), ("train.lr=", "key=v1,v2")])
def test_a_malformed_grid_is_refused_with_its_form(bad, says):
    with pytest.raises(SweepError, match=says):
        parse_grid([bad])


def test_a_key_given_twice_in_the_grid_is_refused():
    with pytest.raises(SweepError, match="train.lr twice"):
        parse_grid(["train.lr=1", "train.lr=2"])


def test_runs_files_in_yaml_and_json_and_crossed_with_a_grid(tmp_path):
    (tmp_path / "runs.yaml").write_text("- {train.lr: 3.0e-4}\n- train.lr: 6.0e-4\n  train.optimizer: muon\n")
    (tmp_path / "runs.json").write_text(json.dumps([{"train.lr": 3e-4}, {"train.lr": 6e-4, "train.optimizer": "muon"}]))
    assert read_runs(tmp_path / "runs.yaml") == read_runs(tmp_path / "runs.json") == [
        {"train.lr": 3e-4}, {"train.lr": 6e-4, "train.optimizer": "muon"}]
    sets = member_sets({"train.max_steps": [2, 4]}, read_runs(tmp_path / "runs.json"))
    assert len(sets) == 4 and sets[3] == {"train.lr": 6e-4, "train.optimizer": "muon", "train.max_steps": 4}
    assert member_sets({}, None) == [{}]  # no grid, no runs: the preset as one member


@pytest.mark.parametrize("text,says", [("{train.lr: 1}", "non-empty list"), ("[]", "non-empty list"),
                                       ("[1, 2]", "member 1 is not a mapping"), ("[: x", "neither YAML nor JSON")])
def test_a_bad_runs_file_is_refused_naming_the_file(tmp_path, text, says):
    path = tmp_path / "runs.yaml"
    path.write_text(text)
    with pytest.raises(SweepError, match=says) as err:
        read_runs(path)
    assert str(path) in str(err.value)
    with pytest.raises(SweepError, match="does not exist"):
        read_runs(tmp_path / "missing.yaml")


def test_each_member_is_the_run_gpt2_run_would_train(tmp_path):
    common = {"train.max_steps": 4, "runtime.work_dir": str(tmp_path / "work")}
    members = resolve_members("smoke", common, [{"train.lr": 1e-3}, {"train.lr": 2e-3}], root=str(tmp_path))
    alone = resolve_config("smoke", ["train.max_steps=4", "train.lr=0.002"], root=str(tmp_path))
    assert members[1].config.train == alone.train
    assert members[1].run_dir == layout.run_dir(alone)  # the same address: an existing run answers it
    assert members[0].run_name != members[1].run_name
    assert [m.label for m in members] == ["train.lr=0.001", "train.lr=0.002"]


def test_bad_members_are_refused_up_front_naming_member_and_key(tmp_path):
    sets = [{"train.lr": 1e-3}, {"train.lrr": 1e-3}, {"train.lr": -1}]
    with pytest.raises(SweepError) as err:
        resolve_members("smoke", {}, sets, root=str(tmp_path))
    lines = str(err.value).splitlines()
    assert lines[0].startswith("member 2 (train.lrr=0.001): unknown key 'train.lrr'") and "train.lr" in lines[0]
    assert lines[1].startswith("member 3 (train.lr=-1): train.lr:")
    assert "nothing was started" in lines[2] and len(lines) == 3
    assert not list(tmp_path.iterdir())  # nothing written


def test_members_that_train_the_same_run_are_refused(tmp_path):
    # The micro-batch never changes the weights: both members are one run.
    with pytest.raises(SweepError, match="members 1 .* and 2 .* train the same run"):
        resolve_members("smoke", {}, [{"train.micro_batch_size": 2}, {"train.micro_batch_size": 4}],
                        root=str(tmp_path))


def test_members_are_grouped_by_their_data(tmp_path):
    sets = [{"train.lr": 1e-3}, {"data.max_tokens": 5000}, {"train.lr": 2e-3}, {"data.shuffle": True}]
    groups = data_groups(resolve_members("smoke", {}, sets, root=str(tmp_path)))
    # data.shuffle is how training reads the shards, not what they hold: the same data stage.
    assert [[m.index for m in g.members] for g in groups] == [[1, 3, 4], [2]]
    assert groups[0].manifest != groups[1].manifest
