"""`gpt2 preflight` against what the world delivers: a good root passes; a
missing, corrupt or truncated shard, an unwritable root, a micro-batch that
does not fit, a live trainer holding the lease and a full disk each fail the
one check that names them, while every other check still runs; a bad config
runs no check at all. In-process (`main(argv)`), tiny config, one timed step."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
from pathlib import Path

import pytest
import torch

from gpt2.checkpoint.lease import Lease
from gpt2.data.manifest import load_manifest
from gpt2.model import GPT
from gpt2.preflight.__main__ import main
from gpt2.preflight.report import ORDER
from gpt2.root import layout, storage
from gpt2.train import memory
from tests.gpt2.train.fixtures import TINY, saved_bytes, tiny_config, write_dataset

LOCAL = ("devices", "data", "root", "disk", "lease", "tracking")
"""The checks that need no training step and no other rank."""
STEPS = ("memory", "compile", "throughput")


def _argv(root: Path, overrides: dict, *extra: str) -> list[str]:
    """The command line of the tiny config at `root`, as tiny_config builds it
    (its work dir under the root), with `overrides` as --set."""
    values = {**TINY, "runtime.work_dir": str(root / "work"), **overrides}
    argv = ["--root", str(root), "--json", "--steps", "1", *extra]
    for key, value in values.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def _preflight(capsys, root: Path, overrides: dict | None = None, *extra: str) -> tuple[int, dict, str]:
    """(exit code, the JSON object of stdout's last line, stderr)."""
    code = main(_argv(root, overrides or {}, *extra))
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]), err


def _ready(tmp_path: Path, overrides: dict | None = None):
    """A root with the tiny config's shards and manifest; (root, config)."""
    root = tmp_path / "root"
    config = tiny_config(root, **(overrides or {}))
    write_dataset(config)
    return root, config


def _status(result: dict, name: str) -> str:
    return result["checks"][name]["status"]


def _detail(result: dict, name: str) -> str:
    return result["checks"][name]["detail"]


def _ran_ok(result: dict, *names: str) -> None:
    """These checks ran and passed (compile is skipped on CPU, with its reason)."""
    for name in names:
        expected = ("skipped",) if name == "compile" else ("ok",)
        assert _status(result, name) in expected, (name, result["checks"][name])


def _train_shard(config) -> str:
    """The file name of the manifest's last train shard."""
    manifest = load_manifest(layout.manifest(config))
    return [e.path for e in manifest.shards if e.split == "train"][-1]


def _shard_path(config, name: str) -> Path:
    return Path(storage.local_path(layout.shard(layout.manifest(config), name)))


def _files_under(path: Path) -> set[Path]:
    return set(path.rglob("*")) if path.exists() else set()


# --- 1. a good root ----------------------------------------------------------


def test_a_good_root_passes_every_check_and_leaves_nothing_behind(tmp_path, capsys):
    root, config = _ready(tmp_path)
    before = _files_under(root)
    code, result, err = _preflight(capsys, root)
    assert code == 0, err
    assert result["ok"] is True and result["failed"] == []
    assert list(result["checks"]) == list(ORDER)  # every check ran, reported in order
    for name, check in result["checks"].items():
        assert check["status"] in ("ok", "skipped", "warn"), (name, check)
        if check["status"] != "ok":
            assert check["detail"], name  # a skip or a warning says why
    assert _status(result, "compile") == "skipped" and "runtime.compile" in _detail(result, "compile")
    assert _status(result, "collectives") == "skipped" and "one rank" in _detail(result, "collectives")
    # 2 train shards + 1 val shard, each read and checked
    assert result["shards"] == 3 and _detail(result, "data").startswith("3 shards")
    assert "sha256 match the manifest" in _detail(result, "data")
    assert result["micro_batch"] == 4 and result["accumulation"] == 2
    assert result["peak_memory_bytes"] > 0 and result["tokens_per_second"] > 0
    assert "2 full steps ran" in _detail(result, "memory")
    # The same run directory the trainer would use, checked read-only...
    run_dir = layout.run_dir(config)
    assert layout.lease_dir(run_dir) in _detail(result, "lease")
    assert run_dir in _detail(result, "root")
    # ...and nothing left behind: no probe object, no directory the probe
    # created, no lease taken, no attempt recorded.
    assert not any(p.name.startswith(".preflight-probe-") for p in root.rglob("*"))
    assert _files_under(root) == before
    assert storage.list_dir(layout.lease_dir(run_dir)) == []
    assert storage.list_dir(layout.attempts_dir(run_dir)) == []
    assert not (root / "runs").exists()


# --- 2-4. damaged data -------------------------------------------------------


def _flip_a_byte(path: Path) -> None:
    """One byte of a token changed, same size, still a valid GPT-2 id (so it
    is the sha256 that catches it, not the id check)."""
    data = bytearray(path.read_bytes())
    offset = 1024  # after the llm.c header
    while int.from_bytes(data[offset:offset + 2], "little") >= 2048:  # skip end-of-text (50256)
        offset += 2
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def _assert_only_data_failed(code: int, result: dict, name: str, others: list[str]) -> str:
    assert code == 1
    assert result["ok"] is False and result["failed"] == ["data"]
    detail = _detail(result, "data")
    assert detail.startswith("1 of 3 shard(s)"), detail
    assert f"{name}: " in detail, detail
    for other in others:
        assert other not in detail
    _ran_ok(result, "devices", "root", "disk", "lease", "tracking", *STEPS)
    return detail


def _one_shard_to_damage(tmp_path):
    """A good root, and the train shard a test damages: (root, its name, the other shards' names, its path)."""
    root, config = _ready(tmp_path)
    name = _train_shard(config)
    others = [e.path for e in load_manifest(layout.manifest(config)).shards if e.path != name]
    return root, name, others, _shard_path(config, name)


def test_a_missing_shard_fails_the_data_check_naming_it(tmp_path, capsys):
    root, name, others, path = _one_shard_to_damage(tmp_path)
    path.unlink()
    code, result, _ = _preflight(capsys, root)
    detail = _assert_only_data_failed(code, result, name, others)
    assert "is missing" in detail


def test_a_flipped_byte_fails_the_data_check_on_its_sha256(tmp_path, capsys):
    root, name, others, path = _one_shard_to_damage(tmp_path)
    size = path.stat().st_size
    _flip_a_byte(path)
    assert path.stat().st_size == size
    code, result, _ = _preflight(capsys, root)
    detail = _assert_only_data_failed(code, result, name, others)
    assert "sha256" in detail and "does not match the manifest" in detail


def test_a_truncated_shard_fails_the_data_check_naming_its_size(tmp_path, capsys):
    root, name, others, path = _one_shard_to_damage(tmp_path)
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-2])  # the last token gone
    code, result, _ = _preflight(capsys, root)
    detail = _assert_only_data_failed(code, result, name, others)
    assert f"has {size - 2} bytes, the manifest says {size}" in detail


# --- 5. the root -------------------------------------------------------------


def test_an_unwritable_root_fails_the_root_check_naming_its_url(tmp_path, capsys):
    # The root's parent is a regular file, so nothing can be created under it.
    # A read-only directory (chmod 0o555) would not do: the tests may run as
    # root (they do in this checkout's container), and root writes there anyway.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = blocker / "root"
    config = tiny_config(root, **{"runtime.work_dir": str(tmp_path / "work")})
    code, result, _ = _preflight(capsys, root, {"runtime.work_dir": str(tmp_path / "work")})
    assert code == 1 and "root" in result["failed"]
    assert _status(result, "root") == "fail"
    detail = _detail(result, "root")
    assert f"cannot write, read back and delete an object under {layout.run_dir(config)}" in detail
    assert "NotADirectoryError" in detail
    # Every other check still ran: those of the root (data, lease) fail on the
    # same root, naming it; those of the machine pass.
    assert _status(result, "data") == "fail" and layout.manifest(config) in _detail(result, "data")
    assert _status(result, "lease") in ("ok", "fail")
    _ran_ok(result, "devices", "disk", *STEPS)
    assert blocker.read_text() == "not a directory"


# --- 6. memory ---------------------------------------------------------------


def test_a_micro_batch_that_does_not_fit_names_the_one_that_does(tmp_path, capsys):
    given = 8  # the tiny config's 8 sequences a step in one micro-batch
    root, config = _ready(tmp_path, {"train.micro_batch_size": given})
    model = GPT(config.model)
    # Halfway between what micro-batches of 4 and of 8 need: 8 cannot fit, 4 can.
    half, full = saved_bytes(model, given // 2), saved_bytes(model, given)
    limit_mb = math.ceil((memory.static_bytes(model) + (half + full) / 2) / memory.MB)
    code, result, _ = _preflight(capsys, root, {"train.micro_batch_size": given, "runtime.memory_limit_mb": limit_mb})
    assert code == 1 and result["failed"] == ["memory"]
    detail = _detail(result, "memory")
    fits = result["micro_batch_fits"]
    assert fits == given // 2
    assert f"train.micro_batch_size={fits} fits" in detail, detail
    assert f"micro-batch {given} (given)" in detail and f"runtime.memory_limit_mb={limit_mb}" in detail
    assert result["micro_batch"] == given
    for name in ("compile", "throughput"):
        assert _status(result, name) == "skipped" and "see memory" in _detail(result, name)
    _ran_ok(result, *LOCAL)


# --- 7. the lease ------------------------------------------------------------


def test_a_live_lease_holder_fails_the_lease_check_naming_it(tmp_path, capsys):
    root, config = _ready(tmp_path)
    directory = layout.lease_dir(layout.run_dir(config))
    held = Lease(directory, ttl_s=120).acquire()
    try:
        code, result, _ = _preflight(capsys, root)
        # The preflight took no generation of its own (only the holder's is there).
        generations = storage.list_dir(directory)
    finally:
        held.release()
    assert generations == ["000001.json"]
    assert code == 1 and result["failed"] == ["lease"]
    detail = _detail(result, "lease")
    assert f"host {socket.gethostname()}, pid {os.getpid()}" in detail, detail
    assert "a live trainer holds the run's lease" in detail
    _ran_ok(result, "devices", "data", "root", "disk", "tracking", *STEPS)
    # nor recorded an attempt
    assert storage.list_dir(layout.attempts_dir(layout.run_dir(config))) == []


# --- 8. the disk -------------------------------------------------------------


def test_too_little_disk_for_the_kept_checkpoints_fails_the_disk_check(tmp_path, capsys):
    # Ten million checkpoints kept, one a step: far more than any disk holds.
    many = 10_000_000
    overrides = {"train.max_steps": many, "train.checkpoint_every": 1, "train.keep_checkpoints": many}
    root, config = _ready(tmp_path, overrides)
    code, result, _ = _preflight(capsys, root, overrides)
    assert code == 1 and result["failed"] == ["disk"]
    detail = _detail(result, "disk")
    found = re.search(r"has ([\d.]+) GB free, the run needs ([\d.]+) GB there", detail)
    assert found, detail
    free, needed = float(found.group(1)), float(found.group(2))
    assert abs(free - shutil.disk_usage(tmp_path).free / 1e9) < 1.0
    # the staged copy in the work dir, and the kept checkpoints under the root (the same disk)
    assert result["disk_needed_bytes"] == (many + 1) * result["checkpoint_bytes"]
    assert needed == pytest.approx(result["disk_needed_bytes"] / 1e9, abs=0.05)
    assert "root: checkpoints" in detail
    _ran_ok(result, "devices", "data", "root", "lease", "tracking", *STEPS)


# --- 9. a bad config ---------------------------------------------------------


@pytest.mark.parametrize("bad, says", [("model.n_layr=2", "unknown key 'model.n_layr'"),
                                       ("train.lr=fast", "train.lr")])
def test_a_bad_config_exits_2_before_any_check(tmp_path, capsys, bad, says):
    root = tmp_path / "root"
    code = main(_argv(root, {}) + ["--set", bad])
    out, err = capsys.readouterr()
    assert code == 2
    assert "error: invalid configuration" in err and says in err
    assert out == ""  # no JSON, no summary
    assert not re.search(r"^(ok|warn|fail|skipped) ", err, re.M)  # no check line
    assert not root.exists()


def test_a_device_this_machine_lacks_fails_the_devices_check_and_the_rest_still_runs(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    root, _ = _ready(tmp_path)
    code, result, _ = _preflight(capsys, root, {"runtime.device": "cuda"})
    assert code == 1 and result["failed"] == ["devices"]
    assert "runtime.device=cuda" in _detail(result, "devices") and "CUDA is not available" in _detail(result, "devices")
    _ran_ok(result, "data", "root", "disk", "lease")
    for name in ("collectives", *STEPS):
        assert _status(result, name) == "skipped" and "needs a usable device" in _detail(result, name)


def test_a_lease_held_by_this_flow_runs_earlier_attempt_is_waited_for_not_failed(tmp_path, capsys, monkeypatch):
    """A rescheduled run (the same flow run) whose old machine still holds the
    lease while it stops: the trainer waits for it (Lease.acquire), so the
    preflight warns instead of failing the run. Found by the fault soak: a
    training machine frozen past the zombie window, rescheduled, thawed."""
    root, config = _ready(tmp_path)
    flow_run = "09ac3231-2c78-4da7-b97c-c972fdef47f4"
    held = Lease(layout.lease_dir(layout.run_dir(config)), ttl_s=120, flow_run_id=flow_run).acquire()
    try:
        monkeypatch.setenv("PREFECT__FLOW_RUN_ID", flow_run)
        code, result, _ = _preflight(capsys, root)
        monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "another-flow-run")
        other_code, other, _ = _preflight(capsys, root)
    finally:
        held.release()
    assert code == 0 and _status(result, "lease") == "warn", result
    assert "this flow run's earlier attempt holds the run's lease" in _detail(result, "lease")
    assert "waits up to 240 s" in _detail(result, "lease")
    assert other_code == 1 and other["failed"] == ["lease"]  # another flow run's trainer: refused as before


def test_a_fine_tunes_weights_are_checked_in_the_root_or_at_their_source(tmp_path):
    """#60: the preflight knows a fine-tune reads its weights first: already in the root, a source
    that answers (read once before the first step), or one that does not exist, failed by name."""
    from gpt2.preflight import storage as root_checks
    from gpt2.preflight.report import Failed
    from gpt2.weights.init import RECORD, cache_dir

    (tmp_path / "hf").mkdir()
    config = tiny_config(tmp_path, **{"train.init_from": str(tmp_path / "hf")})
    assert "answers: its weights are read once into the root" in root_checks.init_weights(config).detail
    storage.write_record(storage.join(cache_dir(config), RECORD), {"sha256": "0" * 64})
    assert "in the root (" in root_checks.init_weights(config).detail
    missing = tiny_config(tmp_path, **{"train.init_from": str(tmp_path / "nothing")})
    with pytest.raises(Failed, match=r"train.init_from=.*nothing does not exist"):
        root_checks.init_weights(missing)
