"""A torchrun child reports progress and outcome in a JSON-lines status file."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from gpt2.checkpoint import store
from gpt2.launch.torchrun import torchrun_command, torchrun_train
from gpt2.train.progress import StepInfo
from gpt2.train.run import Preempted
from gpt2.train.session import TrainingError
from gpt2.train.status_file import StatusFile, step_info
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.tiers import scenario

INFO = StepInfo(step=12, max_steps=60, loss=7.12345, lr=1e-3, grad_norm=0.8123, tokens_per_second=15321.7,
                mfu=None, eta_seconds=3.5, val_loss=3.281)


def test_status_events_round_trip_and_are_read_incrementally(tmp_path):
    writer, reader = StatusFile(tmp_path / "s.jsonl"), StatusFile(tmp_path / "s.jsonl")
    assert reader.read_new() == []  # nothing written yet
    writer.step(INFO)
    [event] = reader.read_new()
    assert event["event"] == "step" and step_info(event) == INFO  # exact: no rounding through text
    assert reader.read_new() == []
    writer.write("done", result={"steps": 60})
    assert reader.read_new() == [{"event": "done", "result": {"steps": 60}}]


def test_a_torn_last_line_is_read_once_it_is_whole(tmp_path):
    path = tmp_path / "s.jsonl"
    line = json.dumps({"event": "step", **INFO.to_dict()}) + "\n"
    path.write_text(line[:20])
    reader = StatusFile(path)
    assert reader.read_new() == []
    with open(path, "a") as f:
        f.write(line[20:])
    assert [step_info(e) for e in reader.read_new()] == [INFO]


def test_torchrun_command_runs_the_trainer_module():
    cmd = torchrun_command(Path("run.json"), Path("s.jsonl"), 8, "abc", {"stage": "train"})
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8"]
    one = torchrun_command(Path("run.json"), Path("s.jsonl"), 1, None, None)
    assert one[1:] == ["-m", "gpt2.train", "--config", "run.json", "--status", "s.jsonl"]  # no torchrun for one
    assert cmd[5:11] == ["-m", "gpt2.train", "--config", "run.json", "--status", "s.jsonl"]
    assert cmd[-4:] == ["--parent-run-id", "abc", "--tag", "stage=train"]


def _two_processes(tmp_path, **overrides):
    config = tiny_config(tmp_path, **{"runtime.nproc_per_node": 2, **overrides})
    write_dataset(config)
    return config


@scenario
def test_torchrun_progress_comes_from_the_status_file(tmp_path):
    config = _two_processes(tmp_path, **{"train.max_steps": 4})
    seen: list[StepInfo] = []
    result = torchrun_train(config, progress=seen.append, log_line=lambda line: None)
    assert result.world_size == 2 and result.steps == 4
    assert [i.step for i in seen] == [1, 2, 3, 4] and all(i.max_steps == 4 for i in seen)


@scenario
def test_torchrun_sigterm_outcome_is_preempted_and_a_training_error_is_named(tmp_path):
    config = _two_processes(tmp_path, **{"train.checkpoint_every": 100})
    seen: list[StepInfo] = []

    def progress(info: StepInfo) -> None:
        seen.append(info)
        if info.step == 2:  # a preemption notice, as the flow process would forward it
            threading.Thread(target=lambda: signal.raise_signal(signal.SIGTERM)).start()

    # forward_sigterm only installs its handler on the main thread: we are on it.
    with pytest.raises(Preempted, match="SIGTERM"):
        torchrun_train(config, progress=progress, log_line=lambda line: None)
    assert 2 <= max(i.step for i in seen) < 8
    assert store.latest_checkpoint(config) is not None

    bad = _two_processes(tmp_path / "bad", **{"train.micro_batch_size": 3})
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match="micro_batch_size=3"):
        torchrun_train(bad, log_line=lambda line: None)
    assert time.monotonic() - t0 < 120


PARENT = """
import json, sys
from gpt2.config.tree import Config
from gpt2.launch.torchrun import torchrun_train
config = Config.model_validate(json.load(open(sys.argv[1])))
torchrun_train(config, progress=lambda info: print("step", info.step, flush=True), log_line=lambda line: None)
"""


@scenario  # a SIGKILLed parent and the cold-started tree under it (~30 s): the end-to-end tier
@pytest.mark.usefixtures("fresh_python")  # the tree of processes under the parent is the point
def test_torchrun_does_not_outlive_a_killed_parent(tmp_path):
    import os
    import subprocess
    import sys

    import psutil

    from tests.gpt2.train.fixtures import write_run_json

    config = _two_processes(tmp_path, **{"train.max_steps": 100_000, "train.checkpoint_every": 100_000})
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    repo = Path(__file__).resolve().parents[3]
    parent = subprocess.Popen([sys.executable, str(script), str(write_run_json(config, tmp_path / "run.json"))],
                              cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, stdout=subprocess.PIPE, text=True)
    for line in parent.stdout:
        if line.startswith("step 2"):
            break
    children = psutil.Process(parent.pid).children(recursive=True)
    assert children, "torchrun was not started"
    parent.kill()  # SIGKILL: no handler of ours runs
    parent.wait()
    gone, alive = psutil.wait_procs(children, timeout=120)
    assert alive == [], [p.cmdline() for p in alive]
    # torchrun passed the SIGTERM on: the workers wrote a checkpoint before
    # exiting, long before the end of the run (orphaned, they would train on).
    latest = store.latest_checkpoint(config)
    assert latest is not None and not latest.endswith("step_100000")


MARK = "GPT2_TESTS_LAUNCH_MARK"


@pytest.fixture(autouse=True)
def _marked(request, monkeypatch):
    """This test's processes carry its id in their environment (the launcher passes its own on)."""
    monkeypatch.setenv(MARK, request.node.nodeid)


def _trainer_pids() -> set[int]:
    """This test's trainer processes, found by its mark among all of the machine's. The warm
    interpreter's servers (tests/warm_python) are shared by the session's pytest workers and live
    under the worker that started them: this test's trainers are descendants of that worker, not
    necessarily of this one (which found none when the other worker had started the servers), and
    another worker's trainers (two ranks of test_zero, say) can be among this one's."""
    import psutil

    mine = []
    for proc in psutil.process_iter():
        try:
            if "gpt2.train" in " ".join(proc.cmdline()) and proc.environ().get(MARK) == os.environ[MARK]:
                mine.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended meanwhile
            continue
    return set(mine)


def _final_weights(config):
    import safetensors.torch

    from gpt2.checkpoint import catalog

    latest = store.latest_checkpoint(config)
    entry = catalog.read_marker(latest)["files"]["model.safetensors"]
    return safetensors.torch.load(store.read_verified(latest, "model.safetensors", entry))


@scenario  # three cold trainers (~40 s): the end-to-end tier
def test_a_trainer_killed_from_outside_is_started_again_and_ends_as_if_never_killed(tmp_path):
    """The kernel's OOM killer or a stray `kill` takes the trainer, not its
    machine: the launcher starts it again from its newest checkpoint (found by
    the fault soak: a SIGKILLed or SIGTERMed trainer failed its pipeline)."""
    import torch

    steps = {"train.max_steps": 8, "train.checkpoint_every": 2, "runtime.lease_ttl_s": 3}
    config = tiny_config(tmp_path / "killed", **steps)
    write_dataset(config)
    stopped, lines = [], []

    def progress(info: StepInfo) -> None:
        if info.step == 3 and len(stopped) < 2:  # after step 2's checkpoint: SIGKILL, then SIGTERM next time
            how = signal.SIGKILL if not stopped else signal.SIGTERM
            for pid in _trainer_pids():
                os.kill(pid, how)
            stopped.append(how)

    result = torchrun_train(config, progress=progress, log_line=lines.append, nproc=1)
    assert stopped == [signal.SIGKILL, signal.SIGTERM] and result.steps == 8
    relaunched = [line for line in lines if "starting it again from its newest checkpoint" in line]
    assert len(relaunched) == 2 and "signal 9 (SIGKILL)" in relaunched[0] and "SIGTERM" in relaunched[1]

    alone = tiny_config(tmp_path / "alone", **steps)
    write_dataset(alone)
    torchrun_train(alone, log_line=lambda line: None, nproc=1)
    a, b = _final_weights(config), _final_weights(alone)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@scenario
def test_a_trainer_killed_again_and_again_fails_naming_how(tmp_path, monkeypatch):
    from gpt2.launch import torchrun

    monkeypatch.setattr(torchrun, "RELAUNCHES", 1)
    config = tiny_config(tmp_path, **{"train.max_steps": 8, "runtime.lease_ttl_s": 3})
    write_dataset(config)

    def progress(info: StepInfo) -> None:
        for pid in _trainer_pids():
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(TrainingError, match="killed by signal 9"):
        torchrun_train(config, progress=progress, log_line=lambda line: None, nproc=1)


# torchrun's own summary as it exits 1 (torch.distributed.elastic's ChildFailedError), as printed in a run.
SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
=====================================================
gpt2.train FAILED
-----------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_15:36:30
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : {other} (pid: 2836)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
-----------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_15:36:30
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : {root} (pid: 2835)
  error_file: <N/A>
  traceback : {traceback}
====================================================="""


@pytest.mark.parametrize("root, other, killed", [("-9", "1", True), ("1", "-9", False), ("1", "1", False)])
def test_a_rank_killed_by_a_signal_is_read_from_torchruns_root_cause(root, other, killed):
    """Several ranks: torchrun exits 1 whatever ended them; only its root
    cause (the first rank to fail) says a signal from outside did (the others
    then fail of its absence, and may record errors of their own)."""
    from gpt2.launch.torchrun import StoppedFromOutside, _outcome

    traceback = "Signal 9 (SIGKILL) received by PID 2835" if root == "-9" else "RuntimeError: boom"
    tail = ["starting", *SUMMARY.format(root=root, other=other, traceback=traceback).splitlines()]
    last = {"event": "error", "message": "Connection closed by peer"}  # a survivor's own report
    with pytest.raises(TrainingError) as raised:
        _outcome(last, 1, tail)
    if killed:
        assert isinstance(raised.value, StoppedFromOutside)
        assert str(raised.value) == ("rank 0 of the trainer was killed by signal 9 (SIGKILL) "
                                     "that did not come through its launcher")
    else:
        assert not isinstance(raised.value, StoppedFromOutside)
        assert "Connection closed by peer" in str(raised.value)
    with pytest.raises(Preempted):  # the launcher's own SIGTERM: the rank's death is its doing
        _outcome({"event": "preempted", "message": "checkpointed"}, 1, tail, signalled=True)


@scenario  # two gloo ranks under torchrun, four launches (~60 s): the end-to-end tier
def test_one_rank_of_several_killed_from_outside_is_started_again_and_ends_as_if_never_killed(tmp_path):
    """The OOM killer takes one rank of a machine's several: torchrun stops
    the others and exits 1; the launcher reads its root cause and starts the
    group again from the newest checkpoint."""
    import torch

    steps = {"train.max_steps": 8, "train.checkpoint_every": 2, "runtime.lease_ttl_s": 3}
    config = _two_processes(tmp_path / "killed", **steps)
    killed, lines = [], []

    def progress(info: StepInfo) -> None:
        if info.step == 3 and not killed:  # after step 2's checkpoint: rank 0, whose outcome nobody then writes
            [rank0] = [pid for pid in _trainer_pids() if _rank_of(pid) == "0"]
            os.kill(rank0, signal.SIGKILL)
            killed.append(rank0)

    result = torchrun_train(config, progress=progress, log_line=lines.append)
    assert len(killed) == 1 and result.steps == 8 and result.world_size == 2
    relaunched = [line for line in lines if "starting it again from its newest checkpoint" in line]
    assert len(relaunched) == 1 and "rank 0 of the trainer was killed by signal 9 (SIGKILL)" in relaunched[0]

    alone = _two_processes(tmp_path / "alone", **steps)
    torchrun_train(alone, log_line=lambda line: None)
    a, b = _final_weights(config), _final_weights(alone)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _rank_of(pid: int) -> str | None:
    """A rank's number (torchrun's own process has none)."""
    import psutil

    return psutil.Process(pid).environ().get("RANK")
