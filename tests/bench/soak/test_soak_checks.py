"""The soak's checker (bench/soak/checks.py): each check finds what it is
there to find, on real files, a real MLflow store and a real lease, and stays
quiet on a clean run; the soak's options refuse an unknown fault by name."""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import save_file

from bench.soak import checks
from bench.soak import run as soak
from gpt2.checkpoint.lease import Lease
from gpt2.tracking.store import default_tracking_uri
from gpt2.tracking.tracker import Tracker
from tests.gpt2.train.fixtures import tiny_config


def _checkpoint(tmp_path, step: int, weight: torch.Tensor) -> str:
    folder = tmp_path / f"step_{step:06d}"
    folder.mkdir(parents=True)
    save_file({"w": weight, "b": torch.zeros(3)}, folder / "model.safetensors")
    return f"file://{folder}"


def test_weights_must_be_final_and_bit_identical(tmp_path):
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    reference = checks.digest(_checkpoint(tmp_path / "ref", 4, weight))
    same, flipped, early = checks.Findings(), checks.Findings(), checks.Findings()
    checks.check_weights(same, _checkpoint(tmp_path / "a", 4, weight.clone()), reference, 4)
    off = weight.clone()
    off.view(torch.int32)[1, 2] ^= 1  # one flipped bit of one weight
    checks.check_weights(flipped, _checkpoint(tmp_path / "b", 4, off), reference, 4)
    checks.check_weights(early, _checkpoint(tmp_path / "c", 3, weight), reference, 4)
    assert same.lost == []
    assert flipped.lost and "differs" in flipped.lost[0][1]
    assert early.lost and "no final checkpoint" in early.lost[0][1]


def test_metric_steps_logged_twice_or_missing_are_found():
    clean, bad = checks.Findings(), checks.Findings()
    every = Counter(range(1, 6))
    checks.check_metrics(clean, {k: every for k in checks.PER_STEP_METRICS} | {"val/loss": Counter([5])}, 5)
    assert clean.lost == clean.duplicates == []
    steps = {k: every for k in checks.PER_STEP_METRICS}
    steps["train/loss"] = Counter([1, 2, 3, 3, 5])  # step 3 twice, step 4 missing
    steps["system/cpu_utilization_percentage"] = Counter([1, 1])  # two machines' monitors: a note only
    checks.check_metrics(bad, steps, 5)
    assert [w for w, _ in bad.duplicates] == ["metric steps"] and "train/loss" in bad.duplicates[0][1]
    assert [w for w, _ in bad.notes] == ["metric steps"] and "system/cpu" in bad.notes[0][1]
    assert [w for w, _ in bad.lost] == ["metric steps"] and "[4]" in bad.lost[0][1]


def test_mlflow_runs_are_one_per_stage_with_their_steps_read_back(tmp_path):
    config = tiny_config(tmp_path)
    flow_run = "11111111-2222-3333-4444-555555555555"
    with Tracker(config, "pipeline", tags={"stage": "pipeline", "prefect.flow_run_id": flow_run}) as parent:
        for stage in ("data", "train", "train"):  # a second training run: a duplicate
            with Tracker(config, stage, parent_run_id=parent.run_id, tags={"stage": stage}) as run:
                for step in range(1, 4):
                    run.log_metrics({k: 1.0 for k in checks.PER_STEP_METRICS}, step=step)
    found = checks.Findings()
    client = MlflowClient(default_tracking_uri(config))
    checks.check_mlflow(found, client, config.tracking.experiment, [flow_run], ("data", "train", "export"), 3)
    assert ("mlflow runs", f"2 train runs under the pipeline runs of {[flow_run]}") in found.duplicates
    assert ("mlflow runs", f"0 export runs under the pipeline runs of {[flow_run]}") in found.lost
    assert not [f for f in found.lost if f[0] == "metric steps"]

    # A rerun (after a full disk): its cached stages answer with the first run's; its own export counts.
    rerun = "66666666-2222-3333-4444-555555555555"
    with Tracker(config, "pipeline", tags={"stage": "pipeline", "prefect.flow_run_id": rerun}) as again:
        with Tracker(config, "export", parent_run_id=again.run_id, tags={"stage": "export"}):
            pass
    both = checks.Findings()
    checks.check_mlflow(both, client, config.tracking.experiment, [flow_run, rerun], ("data", "export"), 3)
    assert both.lost == [] and both.duplicates == []


def test_a_live_lease_temp_files_and_extra_attempts_are_problems(tmp_path):
    run_dir = f"file://{tmp_path / 'run'}"
    found = checks.Findings()
    lease = Lease(f"{run_dir}/lease", ttl_s=60.0)
    assert lease.try_acquire() is None
    checks.check_lease(found, run_dir)
    lease.release()
    checks.check_lease(found, run_dir)  # released: nothing more
    (tmp_path / "run" / "attempts").mkdir(parents=True)
    (tmp_path / "run" / "attempts" / "000001.json").write_text(json.dumps({"lease_generation": lease.generation}))
    bill = checks.Findings()
    checks.check_bill(bill, run_dir, trainers_seen=1, max_steps=8)  # one generation, one record: nothing
    checks.check_bill(bill, run_dir, trainers_seen=3, max_steps=8)  # a trainer killed before the lease: nothing
    assert bill.problems == []
    again = Lease(f"{run_dir}/lease", ttl_s=60.0)
    assert again.try_acquire() is None  # a second trainer held the run ...
    again.release()
    checks.check_bill(bill, run_dir, trainers_seen=2, max_steps=8)  # ... and went unbilled
    (tmp_path / "run" / "attempts" / "000002.json").write_text(json.dumps({"lease_generation": lease.generation}))
    checks.check_bill(bill, run_dir, trainers_seen=1, max_steps=8)  # billed twice, and more records than trainers
    assert [why for _, why in bill.problems] == [
        f"lease generation(s) [{again.generation}] trained with no attempt record",
        f"lease generation(s) [{again.generation}] trained with no attempt record",
        f"lease generation(s) [{lease.generation}] billed more than once",
        "2 attempt record(s) for 1 trainer process(es) seen"]
    found.problems.append(bill.problems[0])
    (tmp_path / "run" / ".state.json.tmp-0a1b2c3d").write_text("")
    checks.check_temp_files(found, tmp_path)
    assert [w for w, _ in found.problems] == ["lease", "bill", "temporary files"]
    assert found.lost == found.duplicates == []


def test_a_trainer_that_took_the_lease_after_the_run_reached_its_last_step_needs_no_record(tmp_path):
    """Found by the long soak: a training flow run killed after its trainer
    finished is rescheduled, and its new trainer takes the lease, resumes at
    the last step, trains nothing and withdraws its attempt record. A
    generation without a record before that one still is a problem."""
    run_dir = f"file://{tmp_path / 'run'}"
    generations = []
    for _ in range(4):
        lease = Lease(f"{run_dir}/lease", ttl_s=60.0)
        assert lease.try_acquire() is None
        lease.release()
        generations.append(lease.generation)
    first, skipped, finished, after = generations
    (tmp_path / "run" / "attempts").mkdir(parents=True)
    for number, generation, step in ((1, first, 4), (2, finished, 8)):
        (tmp_path / "run" / "attempts" / f"{number:06d}.json").write_text(
            json.dumps({"attempt": number, "lease_generation": generation, "step": step, "end": "done"}))
    bill = checks.Findings()
    checks.check_bill(bill, run_dir, trainers_seen=4, max_steps=8)
    assert [why for _, why in bill.problems] == [f"lease generation(s) [{skipped}] trained with no attempt record"]
    short = checks.Findings()  # had the run not reached its last step, the one after would have trained
    checks.check_bill(short, run_dir, trainers_seen=4, max_steps=9)
    assert [why for _, why in short.problems] == [
        f"lease generation(s) [{skipped}, {after}] trained with no attempt record"]


def test_left_running_waits_then_reports():
    found, calls = checks.Findings(), []
    checks.check_left_running(found, lambda: calls.append(1) or (["123 trainer"] if len(calls) < 2 else []),
                                    wait_s=10)
    assert found.problems == [] and len(calls) == 2
    checks.check_left_running(found, lambda: ["123 trainer"], wait_s=0)
    assert found.problems == [("left running", "123 trainer")]


def test_the_soak_refuses_an_unknown_fault_by_name():
    with pytest.raises(argparse.ArgumentTypeError, match="unknown fault kind.*kill:prefect.*known: kill:server"):
        soak._kinds("kill:trainer,kill:prefect")
    opts = soak.parse(["--seed", "3", "--kinds", "pause:trainer,mlflow-away", "--pause-s", "5,9"])
    assert opts.kinds == ["pause:trainer", "mlflow-away"] and opts.pause_s == (5.0, 9.0)


def test_a_pipelines_faults_are_the_scripts_or_drawn_in_order():
    import random

    script = soak.parse(["--script", "kill:server@3,pause:train-run@20:150,disk-full@30"]).script
    assert script == [("kill:server", 3.0, None), ("pause:train-run", 20.0, 150.0), ("disk-full", 30.0, None)]
    assert soak.fault_plan(script, random.Random(1), (10.0, 20.0), 4) == script
    drawn = soak.fault_plan([], random.Random(1), (10.0, 20.0), 4)
    assert [k for k, _, _ in drawn] == [None] * 4 and [d for _, _, d in drawn] == [None] * 4
    moments = [at for _, at, _ in drawn]
    assert moments == sorted(moments) and all(10.0 <= at <= 20.0 for at in moments)
    assert soak.fault_plan([], random.Random(1), (10.0, 20.0), 4) == drawn  # the seed decides


def test_the_soak_passes_only_when_nothing_is_lost_duplicated_or_wrong():
    good = {"lost": 0, "duplicates": 0, "problems": 0, "pipelines": 2, "pipelines_completed": 2}
    assert soak.passed(good)
    for key, value in (("lost", 1), ("duplicates", 1), ("problems", 1), ("pipelines_completed", 1),
                       ("interrupted", "stopped by Ctrl-C during pipeline 2")):
        assert not soak.passed({**good, key: value}), key


def test_a_soak_stopped_by_hand_keeps_the_pipelines_it_checked():
    """The long soak was once stopped on a hang after five pipelines and recorded
    nothing of them; now the loop ends saying why, with the checked ones kept."""
    pipelines = []

    def run_one():
        if len(pipelines) == 2:
            raise KeyboardInterrupt("signal 15")  # main() turns a SIGTERM into this
        return {"pipeline": len(pipelines)}

    why = soak.run_until_stopped(lambda: True, run_one, pipelines)
    assert why == "stopped by signal 15 during pipeline 2" and pipelines == [{"pipeline": 0}, {"pipeline": 1}]
    done = []
    assert soak.run_until_stopped(lambda: len(done) < 3, lambda: done.append(1) or {}, []) is None


def test_the_disk_fill_fills_twice_over_and_frees(tmp_path):
    """The long soak once stopped on an ENOSPC of its own fill: a fill on a disk
    already full (by an earlier fill, or by the pipeline) must hold, not raise."""
    import os

    from bench.soak.faults import DiskFiller
    from bench.soak.stack import mount_small, unmount

    disk = tmp_path / "small"
    if not mount_small(disk, 8):
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        filler = DiskFiller(disk)
        assert filler.fill() > 0
        filler.fill()  # the disk is full already: adds nothing, raises nothing
        with pytest.raises(OSError) as full:
            (disk / "x").write_bytes(b"\0" * 65536)
        assert full.value.errno == 28
        filler.free()
        (disk / "x").write_bytes(b"\0" * 65536)
        assert os.statvfs(disk).f_bavail > 0

        # Full by the pipeline's own files when the fault comes: the same (the soak raised ENOSPC here).
        with open(disk / "pipeline-output", "wb", buffering=0) as out, pytest.raises(OSError):
            while True:
                out.write(b"\0" * 65536)
        filler.fill()
        filler.free()
    finally:
        unmount(disk)


def test_a_trainer_that_lives_only_while_the_soak_waits_is_still_seen():
    """The long soak counted an attempt record against no trainer seen: its loop
    sampled trainers between its reads of the Prefect server, and those waited
    (the server frozen for 96 s) while a whole trainer ran. The sampler is a
    thread of its own."""
    import os
    import subprocess
    import sys
    import time

    from bench.soak.faults import MARK_ENV, TrainersSeen

    mark = f"test-{os.getpid()}-{time.monotonic_ns()}"
    with TrainersSeen(mark, every_s=0.1) as seen:
        trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)", "gpt2.train", "--config"],
                                   env={**os.environ, MARK_ENV: mark})
        trainer.wait()  # the soak's loop, blocked meanwhile
        stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)", "gpt2.train", "--config"])
        stranger.wait()  # not the soak's: no mark
    assert seen.pids == {trainer.pid}
