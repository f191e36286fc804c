"""The trainer as a real process: SIGKILL/SIGTERM and resume, DDP with gloo.

Every run here is a subprocess (`python -m gpt2.train`, or torchrun), so the
kills are real and the reference run has the same threading as the others.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from gpt2.checkpoint import store
from gpt2.checkpoint.lease import Lease
from gpt2.root import layout, storage
from gpt2.train.run import PREEMPTED_EXIT_CODE, train
from tests.gpt2.train.fixtures import tiny_config, write_dataset, write_run_json
from tests.gpt2.train.test_train import weights
from tests.tiers import SCENARIO

REPO = Path(__file__).resolve().parents[3]

# One pytest worker runs this module's tests (--dist loadgroup): the reference
# run they compare against is trained once, not once per worker.
pytestmark = [*SCENARIO, pytest.mark.xdist_group("train_process")]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def launch(config, tmp: Path, torchrun: int = 0) -> subprocess.Popen:
    run_json = write_run_json(config, tmp / f"run-{time.monotonic_ns()}.json")
    args = ["-m", "gpt2.train", "--config", str(run_json), "--result", str(tmp / "result.json")]
    if torchrun:
        args = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}"] + args
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=_env(), stderr=subprocess.PIPE, text=True)


def wait_for(proc: subprocess.Popen, needle: str, lines: list[str]) -> None:
    """Read stderr until a line contains `needle` (or the process ends)."""
    for line in proc.stderr:
        lines.append(line)
        if needle in line:
            return
    raise AssertionError(f"process ended before logging {needle!r}:\n{''.join(lines[-30:])}")


def finish(proc: subprocess.Popen, lines: list[str], timeout: float = 240) -> int:
    out = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    out.start()
    code = proc.wait(timeout=timeout)
    out.join(5)
    return code


def run_to_end(config, tmp: Path, torchrun: int = 0) -> dict:
    proc, lines = launch(config, tmp, torchrun), []
    code = finish(proc, lines)
    assert code == 0, "".join(lines[-40:])
    return json.loads((tmp / "result.json").read_text())


def sigkill(proc: subprocess.Popen, run_dir: str, timeout: float = 30) -> None:
    """SIGKILL the trainer and wait until its process is gone. Under the warm
    interpreter (tests/warm_python) `proc` is a proxy: the server kills the
    trainer it forked an instant after the proxy dies, and a rerun started in
    that instant would find the lease still held by a live process."""
    proc.kill()
    proc.wait()
    _, record = Lease(layout.lease_dir(run_dir), ttl_s=120).current()
    pid = (record or {}).get("holder", {}).get("pid")
    deadline = time.monotonic() + timeout
    while pid is not None and time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    assert pid is None, f"the killed trainer (pid {pid}) was still alive after {timeout:.0f} s"


def kill_mid_checkpoint(proc: subprocess.Popen, run_dir: str, timeout: float = 120) -> str:
    """SIGKILL while a checkpoint directory exists without its COMPLETE marker."""
    base = storage.local_path(storage.join(run_dir, "checkpoints"))
    deadline = time.monotonic() + timeout
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    while time.monotonic() < deadline and proc.poll() is None:
        for d in base.glob("step_*") if base.exists() else []:
            if not (d / store.MARKER).exists():
                sigkill(proc, run_dir)
                return d.name
        time.sleep(0.0005)
    raise AssertionError("never saw a checkpoint being written")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 8-step run in its own process."""
    tmp = tmp_path_factory.mktemp("reference")
    config = tiny_config(tmp)
    write_dataset(config)
    result = run_to_end(config, tmp)
    return config, result


def test_sigkill_at_arbitrary_points_then_rerun_ends_exactly_like_an_uninterrupted_run(reference, tmp_path):
    ref_config, ref = reference
    config = tiny_config(tmp_path)
    write_dataset(config)
    run_dir = layout.run_dir(config)

    proc, lines = launch(config, tmp_path), []
    # Between checkpoints: step 2's is complete (written in the background, so
    # "step 3/8" can be logged before it is) and step 4's is two steps away.
    wait_for(proc, "step_000002 written", lines)
    sigkill(proc, run_dir)
    assert store.latest_checkpoint(config).endswith("step_000002")

    torn = kill_mid_checkpoint(launch(config, tmp_path), run_dir)  # in the middle of writing one
    assert torn not in (store.latest_checkpoint(config) or "")

    result = run_to_end(config, tmp_path)
    assert result["resumed_from_step"] >= 2 and result["steps"] == 8
    assert result["final_val_loss"] == ref["final_val_loss"]
    assert result["final_train_loss"] == ref["final_train_loss"]
    ours, theirs = weights(result["checkpoint"]), weights(ref["checkpoint"])
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    # The optimizer state too: the run can keep going identically.
    a = storage.read_json(storage.join(result["checkpoint"], store.MARKER))["files"]
    b = storage.read_json(storage.join(ref["checkpoint"], store.MARKER))["files"]
    assert a["optimizer.pt"]["sha256"] == b["optimizer.pt"]["sha256"]


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits_nonzero(reference, tmp_path):
    _, ref = reference
    config = tiny_config(tmp_path, **{"train.checkpoint_every": 100})  # only SIGTERM and the end write one
    write_dataset(config)
    proc, lines = launch(config, tmp_path), []
    wait_for(proc, "step 3/8", lines)
    proc.send_signal(signal.SIGTERM)
    code = finish(proc, lines)
    assert code == PREEMPTED_EXIT_CODE, "".join(lines[-20:])
    latest = store.latest_checkpoint(config)
    stopped_at = storage.read_json(storage.join(latest, "state.json"))["step"]
    assert 3 <= stopped_at < 8 and latest.endswith(f"step_{stopped_at:06d}")
    assert any("SIGTERM" in line for line in lines)


def test_ddp_two_gloo_processes_match_one_process_with_accumulation(reference, tmp_path):
    _, ref = reference
    config = tiny_config(tmp_path)  # 8 sequences/step: 2 ranks x 1 micro-batch of 4 vs 1 x 2 x 4
    write_dataset(config)
    result = run_to_end(config, tmp_path, torchrun=2)
    assert result["world_size"] == 2 and result["steps"] == 8
    assert result["final_val_loss"] == pytest.approx(ref["final_val_loss"], abs=1e-4)
    ours, theirs = weights(result["checkpoint"]), weights(ref["checkpoint"])
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-3, atol=1e-4)

    # Resume the 2-process run's step-4 checkpoint in one process: same global
    # batches, so it lands where the uninterrupted single-process run did.
    for url in store.complete_checkpoints(config):
        if not url.endswith("step_000004"):
            shutil.rmtree(storage.local_path(url))
    resumed = train(config)
    assert resumed.resumed_from_step == 4 and resumed.world_size == 1
    assert resumed.final_val_loss == pytest.approx(ref["final_val_loss"], abs=1e-4)
    ours = weights(resumed.checkpoint)
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-3, atol=1e-4)

    # And on two processes again: rank 0 reads step 4 and sends it to rank 1.
    for url in store.complete_checkpoints(config):
        if not url.endswith("step_000004"):
            shutil.rmtree(storage.local_path(url))
    again = run_to_end(config, tmp_path, torchrun=2)
    assert again["resumed_from_step"] == 4 and again["world_size"] == 2
    assert again["final_val_loss"] == pytest.approx(ref["final_val_loss"], abs=1e-4)


def test_a_fine_tune_sigkilled_and_rerun_without_its_source_ends_like_an_uninterrupted_one(tmp_path):
    """`train.init_from` under real kills: the copy in the root, not the source, is what the
    rerun starts from (the source is gone by then), and it ends bit for bit where a fine-tune
    never killed ends, on a root of its own."""
    from tests.gpt2.weights.test_init import _hf_dir

    source, _ = _hf_dir(tmp_path / "hf")
    alone = tiny_config(tmp_path / "alone", **{"train.init_from": str(source)})
    write_dataset(alone)
    ref = run_to_end(alone, tmp_path / "alone")

    config = tiny_config(tmp_path / "killed", **{"train.init_from": str(source)})
    write_dataset(config)
    proc, lines = launch(config, tmp_path), []
    wait_for(proc, "step_000002 written", lines)
    # The same run's name on this root (the weights' sha256 names it, not where they were).
    name = Path(storage.local_path(ref["checkpoint"])).parents[1].name
    run_dir = layout.run_dir_under(layout.root(config), name)
    sigkill(proc, run_dir)
    shutil.rmtree(source)
    result = run_to_end(config, tmp_path)
    assert result["resumed_from_step"] >= 2 and result["steps"] == 8
    assert result["final_val_loss"] == ref["final_val_loss"]
    ours, theirs = weights(result["checkpoint"]), weights(ref["checkpoint"])
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
