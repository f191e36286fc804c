"""`gpt2 sweep` end to end on Prefect's temporary server, as a user runs it, from a runs file of three
smoke members, the command killed outright (SIGKILL to it alone) while its second member trains and
started again: the data stage prepared once for all three; the finished member answered from its run
(no second attempt), the interrupted one resumed from its checkpoint, the third failing in its train
stage alone (the sweep exits 1 naming it); the members' pipeline runs nested under the sweep's MLflow
run with report.png and the table; the resumed member bit for bit the run `gpt2 run` makes alone on
another root, uninterrupted. Its commands and their trainers start from the warm interpreter
(tests/warm_python): what they run is the user's, not how Python starts (the Ctrl-C scenarios and
the quick start as written keep that cold)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.background import started
from tests.cli.stack.fixtures import clean_env
from tests.tiers import SCENARIO
from tests.warm_python import running_pid

pytestmark = SCENARIO

REPO = Path(__file__).resolve().parents[2]
# Checkpoints every 4 of 12 steps: the kill lands after the first, well before the end.
SHORT = ("--preset", "smoke", "--set", "train.max_steps=12", "--set", "train.checkpoint_every=4")
# Member 3 passes every check before the start and fails in its train stage (its memory cannot hold
# the model): its failure is its own, the others finish.
MEMBERS = [{"train.lr": 1e-3}, {"train.lr": 3e-3}, {"train.lr": 5e-3, "runtime.memory_limit_mb": 1}]
TIMEOUT_S = 400


def _gpt2(env: dict, cwd: Path, *args: str, code: int = 0) -> dict:
    done = subprocess.run([sys.executable, "-m", "cli.main", *args, "--json"], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == code, f"gpt2 {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _on(base: Path) -> tuple[str, ...]:
    return ("--root", str(base / "root"), "--set", f"runtime.work_dir={base / 'work'}")


def _weights(checkpoint: str) -> dict:
    from safetensors.torch import load_file

    from gpt2.root.storage import local_path

    return load_file(local_path(checkpoint) / "model.safetensors")


def _complete(run_dir: str) -> list[int]:
    """The steps of the run's complete checkpoints, as the trainer judges them, oldest first."""
    from gpt2.checkpoint.catalog import is_complete, step_dirs

    return sorted(step for step, url in step_dirs(run_dir) if is_complete(url))


def _kill_mid_second_member(env: dict, cwd: Path, sweep: tuple[str, ...], one, two) -> list[int]:
    """Start the sweep, SIGKILL the command once member 1 has finished training and member 2 has
    written a checkpoint; returns member 2's checkpoints at the kill."""
    steps = one.config.train.max_steps
    log = cwd / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", *sweep], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT_S
    while not (_complete(two.run_dir) and steps in _complete(one.run_dir)):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    os.kill(running_pid(proc), signal.SIGKILL)  # the command itself (under a warm interpreter, not its proxy)
    proc.wait()
    at_kill = _complete(two.run_dir)
    assert steps not in at_kill, f"member 2 finished before the kill ({at_kill}): nothing was interrupted"
    return at_kill


def test_a_sweep_killed_mid_member_ends_as_its_members_run_alone(tmp_path):
    import mlflow

    from gpt2.config.overrides import resolve_config
    from gpt2.sweep.members import resolve_members
    from gpt2.train.attempts import read_attempts

    env = {**clean_env(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    (tmp_path / "runs.json").write_text(json.dumps(MEMBERS))
    place = _on(tmp_path / "sweep")
    sweep = ("sweep", *SHORT, "--runs", str(tmp_path / "runs.json"), *place)
    common = {"train.max_steps": 12, "train.checkpoint_every": 4, "runtime.work_dir": place[-1].split("=", 1)[1]}
    one, two, _ = resolve_members("smoke", common, MEMBERS, root=place[1])
    # Member 2 as `gpt2 run` makes it alone, uninterrupted, on another root: trained meanwhile.
    alone = started(_gpt2, env, tmp_path, "run", *SHORT, "--set", "train.lr=3e-3", *_on(tmp_path / "alone"))
    at_kill = _kill_mid_second_member(env, tmp_path, sweep, one, two)

    result = _gpt2(env, tmp_path, *sweep, code=1)
    rows, failed = result["members"][:2], result["members"][2]
    assert [r["state"] for r in result["members"]] == ["cached", "trained", "failed"] and result["failed"] == [3]
    assert "runtime.memory_limit_mb=1" in failed["reason"] and "\n" not in failed["reason"]
    assert failed["final_val_loss"] is None and not failed["best"]
    assert [r["overrides"] for r in result["members"]] == MEMBERS and rows[0]["run"] == one.run_name
    assert all(r["tokens"] == 12 * one.config.train.total_batch_tokens for r in rows)
    best = min(rows, key=lambda r: r["final_val_loss"])
    assert result["best"] == best["member"] and best["best"] and sum(r["best"] for r in result["members"]) == 1
    assert all(r["device_hours"] > 0 for r in rows)
    assert result["bill"]["device_hours"] == pytest.approx(sum(r["device_hours"] for r in result["members"]))

    # None trained twice: member 1 answered from its run, member 2 resumed from its checkpoint. Its
    # trainer, told by its parent's death (SIGTERM), saved and ended `preempted`; killed outright
    # before it could, the next attempt closes it `killed`.
    first, second = read_attempts(one.run_dir), read_attempts(two.run_dir)
    assert len(first) == 1 and first[0]["end"] == "done"
    assert len(second) == 2 and second[0]["end"] in ("preempted", "killed") and second[1]["end"] == "done", second
    assert at_kill[-1] <= second[1]["resumed_from"] < 12

    # One data stage for all three: prepared once (one data run in MLflow), found cached since.
    assert [(d["members"], d["cached"]) for d in result["data"]] == [([1, 2, 3], True)]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'sweep' / 'root' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(resolve_config("smoke").tracking.experiment)
    assert len(client.search_runs([experiment.experiment_id], "tags.stage = 'data'")) == 1
    parent = client.get_run(result["mlflow_run_id"])
    assert result["mlflow_members_url"].endswith(f"%27{parent.info.run_id}%27")  # the table of its children
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"report.png", "sweep.json"}
    for r in rows:  # each member's pipeline run a child of the sweep's, its override a param
        child = client.get_run(r["mlflow_run_id"])
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert float(child.data.params["train.lr"]) == r["overrides"]["train.lr"]

    # The resumed member is exactly the run `gpt2 run` makes alone, uninterrupted, elsewhere.
    alone = alone.result()
    assert rows[1]["final_val_loss"] == alone["final_val_loss"]
    ours, theirs = _weights(rows[1]["checkpoint"]), _weights(alone["checkpoint"])
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
