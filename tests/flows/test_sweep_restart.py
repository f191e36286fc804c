"""`gpt2 sweep` killed outright (SIGKILL to the command alone) while its second member trains, then
started again with the same command: the finished member is answered from its run (no second
attempt), the interrupted one resumes from its checkpoint (its killed attempt closed as such), and
the table ends as an uninterrupted sweep's: the member's weights bit for bit those of `gpt2 run`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.stack.fixtures import clean_env
from tests.flows.test_sweep import _gpt2, _on, _weights

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# Checkpoints every 4 of 12 steps: the kill lands after the first, well before the end.
SETS = ("--preset", "smoke", "--set", "train.max_steps=12", "--set", "train.checkpoint_every=4")
TIMEOUT_S = 400


def _complete(run_dir: str) -> list[int]:
    from gpt2.root.storage import local_path

    found = local_path(run_dir).glob("checkpoints/step_*/COMPLETE")
    return sorted(int(p.parent.name.split("_")[1]) for p in found)


def test_a_sweep_killed_mid_member_resumes_it_and_retrains_nothing(tmp_path):
    from gpt2.sweep.members import resolve_members
    from gpt2.train.attempts import read_attempts

    env = {**clean_env(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    place = _on(tmp_path / "sweep")
    sweep = ("sweep", *SETS, "--grid", "train.lr=1e-3,3e-3", *place)
    common = {"train.max_steps": 12, "train.checkpoint_every": 4, "runtime.work_dir": place[-1].split("=", 1)[1]}
    one, two = resolve_members("smoke", common, [{"train.lr": 1e-3}, {"train.lr": 3e-3}], root=place[1])
    steps = one.config.train.max_steps
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", *sweep], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT_S
    while not (_complete(two.run_dir) and steps in _complete(one.run_dir)):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    proc.kill()  # the command alone, mid-way through member 2's training
    proc.wait()
    at_kill = _complete(two.run_dir)
    assert steps not in at_kill, f"member 2 finished before the kill ({at_kill}): nothing was interrupted"

    again = _gpt2(env, tmp_path, *sweep)
    assert [r["state"] for r in again["members"]] == ["cached", "trained"]
    first, second = read_attempts(one.run_dir), read_attempts(two.run_dir)
    assert len(first) == 1 and first[0]["end"] == "done"  # member 1 never trained twice
    # Its trainer, told by its parent's death (SIGTERM), saved and ended `preempted`; killed outright
    # before it could, the next attempt closes it `killed`. Either way it did not finish.
    assert len(second) == 2 and second[0]["end"] in ("preempted", "killed") and second[1]["end"] == "done", second
    assert at_kill[-1] <= second[1]["resumed_from"] < steps  # from its checkpoint, not from step 0

    alone = _gpt2(env, tmp_path, "run", *SETS, "--set", "train.lr=3e-3", *_on(tmp_path / "alone"))
    row = again["members"][1]
    assert row["final_val_loss"] == alone["final_val_loss"]
    ours, theirs = _weights(row["checkpoint"]), _weights(alone["checkpoint"])
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
