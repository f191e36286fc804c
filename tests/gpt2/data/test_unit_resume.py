"""A coordinator killed for real (SIGKILL of its process, its workers left
to notice alone) loses only the units in flight: the rerun keeps every unit
with a complete record untouched, tokenizes the rest, and gives the shards
of a run never killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from gpt2.config.overrides import resolve_config
from gpt2.data.download import download_source
from gpt2.data.shard import shard_tokens
from gpt2.data.tokenize import tokenize_source
from gpt2.data.tokenized import DONE_RECORD
from gpt2.data.unit_pool import UnitPool
from gpt2.data.units import completed, plan_units
from gpt2.root import layout

_TOKENIZE = """
import sys
from gpt2.root import layout
from gpt2.data.download import download_source
from gpt2.data.tokenize import tokenize_source
from gpt2.data.unit_pool import UnitPool
from gpt2.config.overrides import resolve_config

if __name__ == "__main__":
    config = resolve_config("smoke", dict(a.split("=", 1) for a in sys.argv[2:]), root=sys.argv[1])
    pool = UnitPool(config, layout.data_step_dir(config, "tokenize"), 2)
    tokenize_source(config, download_source(config), show_progress=False, executor=pool)
"""

WAIT_S = 120
"""Far above the few seconds the run below needs before its 10th unit."""


def test_killed_coordinator_reruns_only_the_units_without_a_record(tmp_path, prose_docs):
    src = tmp_path / "corpus.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for d in prose_docs * 4:
            f.write(json.dumps({"text": d["text"]}) + "\n")
    common = {"data.source": str(src), "runtime.tokenize_part_tokens": 1500, "data.shard_size": 16384,
              "data.val_tokens": 4000}

    def config_in(work: str):
        return resolve_config("smoke", {**common, "runtime.work_dir": str(tmp_path / work)},
                              root=str(tmp_path / "root"))

    clean_config = config_in("clean")
    clean = shard_tokens(clean_config, tokenize_source(clean_config, download_source(clean_config),
                                                       show_progress=False))

    config = config_in("killed")
    directory = layout.data_step_dir(config, "tokenize")
    units = plan_units(download_source(config), 1500)
    script = tmp_path / "tokenize_run.py"  # a file, so spawned workers can re-import the main module
    script.write_text(_TOKENIZE)
    args = [f"{k}={v}" for k, v in {**common, "runtime.work_dir": str(tmp_path / "killed")}.items()]
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "root"), *args])
    deadline = time.monotonic() + WAIT_S
    while len(list(directory.glob("part_*.json"))) < 10 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(WAIT_S) == -signal.SIGKILL
    assert not (directory / DONE_RECORD).exists(), "the run finished before the kill"

    time.sleep(1)  # the orphaned workers see their pipes close and finish their unit, or die
    kept = {u.index: (directory / u.name).stat().st_mtime_ns for u in units if completed(str(directory), u)}
    assert 10 <= len(kept) < len(units)
    resumed = tokenize_source(config, download_source(config), show_progress=False,
                              executor=UnitPool(config, directory, 2))
    assert {i: (directory / units[i].name).stat().st_mtime_ns for i in kept} == kept  # not redone
    assert all(completed(str(directory), u) for u in units)
    shards = shard_tokens(config, resumed)
    assert [(e.path, e.sha256) for e in shards.shards] == [(e.path, e.sha256) for e in clean.shards]
