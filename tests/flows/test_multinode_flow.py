"""The training flow as one node of a two-node run (the other node a plain
torchrun launcher, c10d on loopback): when the other machine is preempted,
this flow run ends Crashed, as a preempted machine's own run does, which is
the state the reschedule automation resumes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort

from gpt2.checkpoint import store
from gpt2.launch import multinode
from gpt2.launch.torchrun import torchrun_command
from gpt2.root import storage
from gpt2.train.status_file import StatusFile
from tests.gpt2.train.fixtures import TINY, tiny_config, write_dataset, write_run_json
from tests.tiers import SCENARIO

pytestmark = SCENARIO

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_preempted_other_node_ends_this_flow_run_crashed(tmp_path, prefect_server):
    settings = {**TINY, "runtime.work_dir": str(tmp_path / "work"), "train.max_steps": 12,
                "train.checkpoint_every": 100, "runtime.nnodes": 2,
                "runtime.rdzv_endpoint": f"127.0.0.1:{_free_port()}"}
    config = tiny_config(tmp_path / "root", **settings)
    write_dataset(config)

    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "PREFECT_API_URL": prefect_server}
    # The other machine: the same config through the same launcher command.
    status = StatusFile(tmp_path / "other.jsonl")
    cmd = torchrun_command(write_run_json(config, tmp_path / "run.json"), status.path, 1, None, None,
                           multinode.rendezvous_args(config))
    other = _start(cmd, env)
    # This machine: the training flow, in a process of its own (Prefect ends a crashed run's process by the signal).
    flow = _start([sys.executable, "-m", "flows.train", "--root", str(tmp_path / "root"),
                   *[f"--set={k}={v}" for k, v in settings.items()]], env)
    seen, lines = threading.Event(), []

    def follow(proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            lines.append(line)
            if "step 2/" in line:  # global rank 0, on either machine, finished step 2
                seen.set()

    for proc in (other, flow):
        threading.Thread(target=follow, args=(proc,), daemon=True).start()
    assert seen.wait(240), "".join(lines[-40:])
    other.send_signal(signal.SIGTERM)  # the other machine is preempted
    assert other.wait(120) != 0 and flow.wait(180) != 0, "".join(lines[-40:])
    assert status.read_new()[-1]["event"] == "preempted"
    latest = store.latest_checkpoint(config)
    assert 2 <= storage.read_json(storage.join(latest, "state.json"))["step"] < 12

    with get_client(sync_client=True) as client:
        [run] = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["gpt2-train"])),
                                      sort=FlowRunSort.START_TIME_DESC, limit=1)
    assert run.state.type == StateType.CRASHED, (run.state, "".join(lines[-40:]))


def _start(cmd: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
