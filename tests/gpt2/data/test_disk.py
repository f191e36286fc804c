"""Local disk: the data stage says what it needs before it starts, refuses to
start without it, and removes the copies runtime.keep_intermediate does not keep."""

from __future__ import annotations

import logging
import shutil

import pytest

from gpt2.config.overrides import resolve_config
from gpt2.data import prepare, sources
from gpt2.data.disk import NotEnoughDisk, plan
from gpt2.root import layout
from tests.conftest import write_jsonl


def _config(tmp_path, source, **overrides):
    values = {"data.source": str(source), "data.val_tokens": 2000, "data.shard_size": 8192,
              "runtime.work_dir": str(tmp_path / "work"), **overrides}
    return resolve_config("smoke", values, root=str(tmp_path / "root"))


def test_needs_follow_the_mode_and_count_a_local_root(tmp_path, prose_docs):
    src = write_jsonl(tmp_path / "c.jsonl", prose_docs)
    needs = {}
    for keep in ("all", "inputs", "none"):
        config = _config(tmp_path, src, **{"runtime.keep_intermediate": keep})
        p = plan(config, sources.resolve(config.data))
        [(where, need)] = p.needs.items()  # work dir and root share this filesystem
        needs[keep] = need
        assert p.estimated and p.tokens == int(src.stat().st_size / 3.5)
    copy = int(int(src.stat().st_size / 3.5) * 2 * 1.05)
    # Uploading holds parts + local shards + the root's shards (the local source is read in place).
    assert needs["all"] == needs["inputs"] == 3 * copy
    assert needs["none"] == 2 * copy  # the parts went once the shards were written
    capped = _config(tmp_path, src, **{"data.max_tokens": 5000})
    assert plan(capped, sources.resolve(capped.data)).tokens == 5000


def test_not_enough_disk_is_refused_before_any_work(tmp_path, caplog):
    huge = tmp_path / "huge.jsonl"
    with open(huge, "wb") as f:  # sparse: twice the free space in apparent size, no blocks
        f.truncate(2 * shutil.disk_usage(tmp_path).free)
    config = _config(tmp_path, huge)
    with pytest.raises(NotEnoughDisk, match=r"not enough local disk.*work.*runtime.keep_intermediate=none"):
        prepare.prepare_data(config, show_progress=False)
    assert not layout.data_step_dir(config, "tokenize").exists()


def test_the_need_is_logged_up_front_and_copies_go_by_mode(tmp_path, prose_docs, caplog):
    src = write_jsonl(tmp_path / "c.jsonl", prose_docs)
    caplog.set_level(logging.INFO, logger="gpt2.data.disk")
    kept = {}
    for keep in ("all", "inputs", "none"):
        config = _config(tmp_path / keep, src, **{"runtime.keep_intermediate": keep})
        prepare.prepare_data(config, show_progress=False)
        kept[keep] = {step for step in ("tokenize", "shard") if layout.data_step_dir(config, step).exists()}
    assert kept == {"all": {"tokenize", "shard"}, "inputs": {"tokenize"}, "none": set()}
    assert "needs" in caplog.text and "free" in caplog.text
    assert src.exists()  # a local source is never removed, whatever the mode


def test_a_new_shard_size_reshards_from_the_kept_tokens(tmp_path, prose_docs):
    src = write_jsonl(tmp_path / "c.jsonl", prose_docs)
    config = _config(tmp_path, src)
    prepare.prepare_data(config, show_progress=False)
    record = layout.data_step_dir(config, "tokenize") / "done.json"
    before = record.stat().st_mtime_ns
    resharded = _config(tmp_path, src, **{"data.shard_size": 4096})
    result = prepare.prepare_data(resharded, show_progress=False)
    assert result.shards > 2 and record.stat().st_mtime_ns == before  # not re-tokenized
