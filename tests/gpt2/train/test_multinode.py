"""Two "nodes" on loopback: two torchrun launchers, one process each, meeting
at a c10d rendezvous on 127.0.0.1 (gloo, CPU), train exactly like one node
with two processes and the same global batch; a SIGTERM to one node stops
both at the same step with a checkpoint, and rerunning both resumes to the
uninterrupted result."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from gpt2.checkpoint import store
from gpt2.launch import multinode
from gpt2.launch.torchrun import torchrun_command
from gpt2.root import layout, storage
from gpt2.train.attempts import read_attempts
from gpt2.train.run import PREEMPTED_EXIT_CODE
from gpt2.train.status_file import StatusFile
from tests.gpt2.train.fixtures import tiny_config, write_dataset, write_run_json
from tests.gpt2.train.test_train import weights
from tests.tiers import SCENARIO

# One pytest worker runs this module (--dist loadgroup): its module-scoped fixture is built once, not once per worker.
pytestmark = [*SCENARIO, pytest.mark.xdist_group("multinode")]

REPO = Path(__file__).resolve().parents[3]
# Only the end (and a SIGTERM) write a checkpoint: 12 steps leave room to stop in between.
SETTINGS = {"train.max_steps": 12, "train.checkpoint_every": 100}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One machine's launcher: `torchrun` with the config's rendezvous flags."""

    def __init__(self, config, tmp: Path, name: str, nproc: int = 1):
        run_json = write_run_json(config, tmp / f"{name}-{time.monotonic_ns()}.json")
        self.status = StatusFile(tmp / f"{name}-{time.monotonic_ns()}.jsonl")
        rendezvous = multinode.rendezvous_args(config) if config.runtime.nnodes > 1 else None
        cmd = torchrun_command(run_json, self.status.path, nproc, None, None, rendezvous)
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()
        self.events: list[dict] = []

    def wait(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(5)
        self.events += self.status.read_new()
        return code

    def outcome(self) -> dict:
        assert self.events, "no outcome written:\n" + "".join(self.lines[-40:])
        return self.events[-1]


def _config(tmp: Path, nnodes: int):
    extra = {"runtime.nnodes": 2, "runtime.rdzv_endpoint": f"127.0.0.1:{_free_port()}"} if nnodes > 1 else {}
    config = tiny_config(tmp, **SETTINGS, **extra)
    write_dataset(config)
    return config


def _two_nodes(config, tmp: Path) -> list[Node]:
    return [Node(config, tmp, "node-a"), Node(config, tmp, "node-b")]


def _done(nodes: list[Node]) -> dict:
    """Both nodes ended done; the result of the node that held global rank 0 (it names the checkpoint)."""
    for node in nodes:
        code = node.wait()
        assert code == 0 and node.outcome()["event"] == "done", "".join(node.lines[-40:])
    results = [node.outcome()["result"] for node in nodes]
    [main] = [r for r in results if r["checkpoint"]]
    assert all(r["world_size"] == 2 and r["steps"] == 12 for r in results)
    return main


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """The reference: one node, two processes, the same global batch."""
    tmp = tmp_path_factory.mktemp("one-node")
    node = Node(_config(tmp, nnodes=1), tmp, "single", nproc=2)
    assert node.wait() == 0, "".join(node.lines[-40:])
    result = node.outcome()["result"]
    assert result["world_size"] == 2 and result["steps"] == 12
    return result


def _assert_same_run(result: dict, reference: dict) -> None:
    assert result["final_train_loss"] == pytest.approx(reference["final_train_loss"], abs=1e-6)
    assert result["final_val_loss"] == pytest.approx(reference["final_val_loss"], abs=1e-6)
    ours, theirs = weights(result["checkpoint"]), weights(reference["checkpoint"])
    assert ours.keys() == theirs.keys()
    # Equal up to float rounding: gloo reduces the gradients of the two launchers in its own order
    # (last-bit differences, ~1e-8), which AdamW magnifies where a gradient is near zero (~1e-6).
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-4, atol=1e-5)


def test_two_nodes_train_exactly_like_one_node_with_the_same_global_batch(one_node, tmp_path):
    config = _config(tmp_path, nnodes=2)
    result = _done(_two_nodes(config, tmp_path))
    _assert_same_run(result, one_node)
    # One attempt, written once by global rank 0, on every device of both machines.
    (record,) = read_attempts(layout.run_dir(config))
    assert record["end"] == "done" and record["devices"] == result["world_size"]
    assert result["bill"]["attempts"] == 1


def _wait_for_step(nodes: list[Node], step: int, timeout: float = 240) -> None:
    """Until global rank 0 (on either node) reports `step`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            node.events += node.status.read_new()
            if any(e["event"] == "step" and e["step"] >= step for e in node.events):
                return
            if node.proc.poll() is not None:
                raise AssertionError("a node ended early:\n" + "".join(node.lines[-40:]))
        time.sleep(0.01)
    raise AssertionError(f"no node reported step {step}")


def test_sigterm_on_one_node_stops_both_with_a_checkpoint_and_a_rerun_resumes(one_node, tmp_path):
    config = _config(tmp_path, nnodes=2)
    nodes = _two_nodes(config, tmp_path)
    _wait_for_step(nodes, 2)
    nodes[1].proc.send_signal(signal.SIGTERM)  # a preemption notice to one machine only
    codes = [node.wait() for node in nodes]
    assert [node.outcome()["event"] for node in nodes] == ["preempted", "preempted"], codes
    latest = store.latest_checkpoint(config)
    stopped_at = storage.read_json(storage.join(latest, "state.json"))["step"]
    assert 2 <= stopped_at < 12
    # Both nodes stopped after the same step: each says so in its outcome.
    assert all(f"after step {stopped_at};" in node.outcome()["message"] for node in nodes)
    assert PREEMPTED_EXIT_CODE in codes or all(code != 0 for code in codes)

    # Rerun both nodes (a new rendezvous port, as a rescheduled job would get): they resume and end
    # exactly where the uninterrupted run ended.
    port = _free_port()
    again = config.model_copy(update={"runtime": config.runtime.model_copy(
        update={"rdzv_endpoint": f"127.0.0.1:{port}"})})
    result = _done(_two_nodes(again, tmp_path))
    assert result["resumed_from_step"] == stopped_at
    _assert_same_run(result, one_node)
    assert result["bill"]["ends"] == {"preempted": 1, "done": 1} and result["bill"]["steps_redone"] == 0


def test_the_launcher_refuses_a_config_that_cannot_rendezvous(tmp_path):
    from gpt2.launch.torchrun import train_stage
    from gpt2.train.session import TrainingError

    with pytest.raises(multinode.RendezvousError, match=r"runtime\.nnodes=2 needs runtime\.rdzv_endpoint"):
        train_stage(tiny_config(tmp_path, **{"runtime.nnodes": 2}))
    for bad in ("node0", "node0:port", "node0:70000", "http://node0:29500", ":29500"):
        with pytest.raises(multinode.RendezvousError, match="runtime.rdzv_endpoint"):
            train_stage(tiny_config(tmp_path, **{"runtime.nnodes": 2, "runtime.rdzv_endpoint": bad}))
    # 256 tokens per step are 8 sequences of 32: they split over 2 nodes x 4 processes, not 3 nodes x 1.
    with pytest.raises(TrainingError, match=r"block_size × devices = 32 × 3"):
        train_stage(tiny_config(tmp_path, **{"runtime.nnodes": 3, "runtime.rdzv_endpoint": "n0:29500"}))


def test_rendezvous_flags_and_the_local_root_warning(tmp_path, caplog):
    config = tiny_config(tmp_path, **{"runtime.nnodes": 2, "runtime.rdzv_endpoint": "[fd00::1]:29500"})
    assert multinode.parse_endpoint("[fd00::1]:29500") == ("[fd00::1]", 29500)
    wait = int(config.runtime.rdzv_timeout_s)
    assert wait >= 15 * 60  # nodes of a cold cluster start minutes apart
    assert multinode.rendezvous_args(config) == [
        "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=[fd00::1]:29500",
        f"--rdzv-id={multinode.rdzv_id(config)}", f"--rdzv-conf=read_timeout={wait},join_timeout={wait}"]
    # Both waits come from the one setting.
    slow = tiny_config(tmp_path, **{"runtime.nnodes": 2, "runtime.rdzv_endpoint": "n0:29500",
                                    "runtime.rdzv_timeout_s": wait + 1})
    assert multinode.rendezvous_args(slow, is_host=False)[-1] == \
        f"--rdzv-conf=read_timeout={wait + 1},join_timeout={wait + 1},is_host=false"
    # The id is the run's: the same on every node, and unchanged by where the nodes meet.
    other = tiny_config(tmp_path, **{"runtime.nnodes": 4, "runtime.rdzv_endpoint": "node0:1234"})
    assert multinode.rdzv_id(other) == multinode.rdzv_id(config)
    assert multinode.rendezvous_args(tiny_config(tmp_path)) == ["--standalone"]
    with caplog.at_level("WARNING", logger="gpt2.launch.multinode"):
        multinode.check(config)
    assert "storage all nodes share" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpt2.launch.multinode"):
        multinode.check(tiny_config("memory://shared-root", **{"runtime.nnodes": 2,
                                                               "runtime.rdzv_endpoint": "n0:29500"}))
    assert caplog.text == ""
    assert multinode.world_size(config, 8) == 16
