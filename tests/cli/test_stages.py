"""`gpt2 train`: the missing-data message and the --json result (real
Prefect server and MLflow, the flow in-process)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from gpt2.root import storage
from tests.gpt2.train.fixtures import TINY, tiny_config, write_dataset
from tests.tiers import scenario

KEYS = {"run_name", "checkpoint", "steps", "resumed_from_step", "final_train_loss", "final_val_loss",
        "tokens_per_second", "mlflow_run_id"}


def test_cli_says_how_to_make_missing_data(tmp_path):
    out = CliRunner().invoke(app, ["train", "--preset", "smoke", "--root", str(tmp_path / "empty"),
                                   "--set", "train.max_steps=5"])
    assert out.exit_code == 1
    assert "manifest.json does not exist" in out.output
    assert f"gpt2 prepare --preset smoke --set train.max_steps=5 --root {tmp_path / 'empty'}" in out.output


def test_a_device_this_machine_lacks_is_named_before_any_server_or_stage(tmp_path):
    import os
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    root = tmp_path / "root"
    from gpt2.config.overrides import resolve_config

    write_dataset(resolve_config("smoke", {"runtime.work_dir": str(tmp_path / "work")}, root=str(root)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")  # where a temporary server would put its database
    out = subprocess.run([sys.executable, "-m", "cli.main", "train", "--preset", "smoke", "--root", str(root),
                          "--set", "runtime.device=cuda", "--set", f"runtime.work_dir={tmp_path / 'work'}"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: runtime.device=cuda but CUDA is not available")
    assert not (tmp_path / "prefect-home").exists()  # no server was started
    assert not (root / "runs").exists()  # nothing trained, no lease taken


@pytest.mark.parametrize("command", ["run", "evaluate"])  # the pipeline before its data stage; evaluate on its own
def test_the_pipeline_names_a_device_this_machine_lacks_before_its_data_stage(command, tmp_path, monkeypatch):
    import torch

    import cli.stages

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    flows_run = []
    monkeypatch.setattr(cli.stages, "run_flow", lambda *a, **kw: flows_run.append(a))
    out = CliRunner().invoke(app, [command, "--preset", "smoke", "--root", str(tmp_path / "root"),
                                   "--set", "runtime.device=cuda:1"])
    assert out.exit_code == 1 and "runtime.device=cuda:1 but CUDA is not available" in out.output
    assert flows_run == []  # not even the data stage


def test_cli_json_result(tmp_path, prefect_server):
    overrides = {**TINY, "runtime.work_dir": str(tmp_path / "work"), "train.max_steps": 2, "train.checkpoint_every": 2}
    write_dataset(tiny_config(tmp_path / "root", **overrides))
    sets = [f"{k}={v}" for k, v in overrides.items()]
    cmd = ["train", "--preset", "smoke", "--root", str(tmp_path / "root"), "--json"]
    for s in sets:
        cmd += ["--set", s]
    out = CliRunner().invoke(app, cmd)
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert KEYS <= set(result)
    assert result["steps"] == 2 and result["resumed_from_step"] == 0
    assert result["bill"]["attempts"] == 1 and result["bill"]["device_hours"] > 0
    assert isinstance(result["final_val_loss"], float) and result["checkpoint"].endswith("step_000002")
    # Full precision: exactly the number the checkpoint recorded.
    assert storage.read_json(storage.join(result["checkpoint"], "state.json"))["val_loss"] == result["final_val_loss"]


@scenario  # two `gpt2 train` processes, each with its flow and trainer, through a SIGTERM; warm
def test_sigterm_to_gpt2_train_checkpoints_and_exits_143_then_a_rerun_continues(tmp_path, prefect_server):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from gpt2.checkpoint import store
    from gpt2.root import layout

    # The SIGTERM goes as soon as the lease is taken, before the first step:
    # 40 steps leave it far inside training, and the rerun trains the rest.
    steps = 40
    overrides = {**TINY, "runtime.work_dir": str(tmp_path / "work"), "train.max_steps": steps,
                 "train.checkpoint_every": 10_000, "train.eval_every": 10_000, "train.sample_every": 10_000,
                 "eval.every_steps": 0}  # no in-loop HellaSwag: the steps are what the signal must land in
    config = tiny_config(tmp_path / "root", **overrides)
    write_dataset(config)
    cmd = [sys.executable, "-m", "cli.main", "train", "--preset", "smoke", "--root", str(tmp_path / "root"), "--json"]
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={v}"]
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lease = storage.local_path(layout.run_dir(config)) / "lease"
    while not lease.exists():
        assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    # Prefect ends the process with the signal itself once the run is marked
    # Crashed: a shell sees 143, as after any SIGTERM.
    assert proc.returncode in (143, -signal.SIGTERM), out + err
    assert "stopped by SIGTERM after step" in err and "Finished in state Crashed" in err
    stopped_at = int(store.latest_checkpoint(config).rsplit("_", 1)[1])
    assert stopped_at < steps

    again = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert result["resumed_from_step"] == stopped_at and result["steps"] == steps
    # Both attempts are on the bill: the preempted one and the one that finished.
    assert result["bill"]["attempts"] == 2 and result["bill"]["ends"] == {"preempted": 1, "done": 1}
    assert result["bill"]["steps_redone"] == 0  # the SIGTERM's checkpoint kept every step


@pytest.mark.parametrize("command", [["prepare"], ["train"], ["run"], ["plan"], ["config", "show"]])
def test_the_preset_option_names_every_preset(command):
    from gpt2.config.presets import PRESETS

    out = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    assert f"Named preset: {', '.join(PRESETS)}." in " ".join(out.output.replace("│", " ").split()), out.output


@pytest.mark.parametrize("preset", ["smoke", "gpt2-124m"])
def test_the_run_summary_rounds_its_figures_and_says_what_it_lacks(tmp_path, preset):
    from cli.stages import where_things_are
    from gpt2.config.overrides import resolve_config

    config = resolve_config(preset, {"runtime.work_dir": str(tmp_path / "work")}, root=str(tmp_path / "root"))
    bill = {"attempts": 1, "device_hours": 0.0123456, "steps_redone": 0, "device_hours_redone": 0.0,
            "startup_s": 3.2, "cost": None}
    result = {"cached_stages": [], "mlflow_url": None, "final_val_loss": 6.123456789, "checkpoint": "c",
              "hellaswag": {"acc": 0.25, "acc_norm": 1 / 3, "n": 12}, "hf_dir": "h", "llmc_bin": "l",
              "mlflow_run_id": "r", "registered_model": "m", "model_version": 1, "bill": bill}
    text = where_things_are(config, result)
    assert "final val loss:   6.1235\n" in text and "acc 0.2500  acc_norm 0.3333  (n=12)" in text
    assert "cost unknown (set runtime.price_per_hour)" in text
    # The smoke preset scores the built-in format sample: said so, so no one reads it as GPT-2's benchmark.
    assert ("not the benchmark" in text) is (preset == "smoke")


@pytest.mark.e2e  # the command's own process and Prefect's temporary server, as a user starts it (cold)
def test_the_error_is_the_last_line_on_stderr_after_the_temporary_servers_shutdown(tmp_path, fresh_python):
    import os
    import subprocess
    import sys
    from pathlib import Path

    # A source whose documents lack the text field: found only by reading it, inside the data stage,
    # after the server started (a missing source is answered before any server: #64 item 3).
    missing = tmp_path / "docs.jsonl"
    missing.write_text('{"content": "no text field here"}\n' * 3)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # Prefect starts its temporary server
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "cli.main", "prepare", "--root", str(tmp_path / "root"),
                           "--set", f"data.source={missing}", "--set", f"runtime.work_dir={tmp_path / 'work'}"],
                          cwd=repo, env={**env, "PYTHONPATH": str(repo)}, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and "Starting temporary server" in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith("error: ") and str(missing) in lines[-1] and "no field 'text'" in lines[-1], \
        proc.stderr[-3000:]
    # The temporary server's run history is in the work dir, not in Prefect's home.
    assert (tmp_path / "work" / "prefect.db").exists() and not (tmp_path / "prefect-home" / "prefect.db").exists()
    # A user error: its message, no traceback on the console; the traceback is in the log file it names (#46).
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (log,) = (tmp_path / "work" / "logs").glob("gpt2-*.log")
    assert f"(traceback in {log})" in proc.stderr and "Traceback" in log.read_text()


def test_the_mlflow_ui_command_pastes_as_is_from_a_root_with_a_space(tmp_path):
    import shlex

    from cli.stages import where_things_are
    from gpt2.config.overrides import resolve_config

    root = tmp_path / "with space" / "root"
    config = resolve_config("smoke", {"runtime.work_dir": str(tmp_path / "work")}, root=str(root))
    result = {"cached_stages": [], "mlflow_url": "http://x", "final_val_loss": None, "checkpoint": "c",
              "hellaswag": {}, "hf_dir": "h", "llmc_bin": "l", "mlflow_run_id": "r", "registered_model": "m",
              "model_version": 1, "bill": None}
    line = next(line for line in where_things_are(config, result).splitlines() if "mlflow ui" in line)
    command = shlex.split(line.split("MLflow UI:", 1)[1], comments=True)
    assert command[:2] == ["mlflow", "ui"] and command[3] == f"sqlite:///{root / 'mlflow.db'}", command


@pytest.mark.parametrize("command", [["prepare"], ["train"]])  # every flow's command, and train's own check
def test_a_bucket_root_that_does_not_answer_is_named_before_anything_runs(command, tmp_path, monkeypatch):
    """#33: a supported scheme whose endpoint cannot be reached fails naming the root, at once,
    not with the filesystem's error from inside a stage."""
    import socket

    import fsspec

    pytest.importorskip("s3fs")
    with socket.socket() as s:  # a port nothing listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries: seconds of back-off
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": f"http://127.0.0.1:{port}"})
    fsspec.filesystem("s3").clear_instance_cache()
    out = CliRunner().invoke(app, [*command, "--preset", "smoke", "--root", "s3://unreachable-bucket/gpt2",
                                   "--set", f"runtime.work_dir={tmp_path / 'work'}"])
    assert out.exit_code == 1, out.output
    assert "artifact root s3://unreachable-bucket/gpt2 cannot be reached (EndpointConnectionError" in out.output
    assert not (tmp_path / "work").exists()  # no stage ran: no data, no Prefect database


@pytest.mark.parametrize("command", ["prepare", "run"])
@pytest.mark.parametrize(("source", "says"), [
    ("nothing-*.jsonl", "no files match"),
    ("nanogpt-dir", "lacks val.bin and train.bin"),
])
def test_a_missing_local_source_is_answered_once_before_any_server_or_stage(command, source, says, tmp_path,
                                                                              monkeypatch):
    """#64 item 3: a mistyped data.source used to answer after the Prefect server's start, five times."""
    import cli.stages

    flows_run = []
    monkeypatch.setattr(cli.stages, "run_flow", lambda *a, **kw: flows_run.append(a))
    (tmp_path / "nanogpt-dir").mkdir()  # a folder without nanoGPT's train.bin/val.bin
    fmt = ["--set", "data.source_format=nanogpt-bin"] if source == "nanogpt-dir" else []
    out = CliRunner().invoke(app, [command, "--preset", "smoke", "--root", str(tmp_path / "root"),
                                   "--set", f"data.source={tmp_path / source}", *fmt,
                                   "--set", f"runtime.work_dir={tmp_path / 'work'}"])
    assert out.exit_code == 1, out.output
    assert out.output.count(says) == 1 and out.output.startswith("error: "), out.output
    assert flows_run == [] and not (tmp_path / "work").exists()  # no stage, no Prefect database


def test_a_prepared_dataset_whose_local_source_is_gone_still_runs(tmp_path, monkeypatch):
    import cli.stages
    from gpt2.config.overrides import resolve_config

    flows_run = []
    answer = {"cached": True, "shards": 3, "train_tokens": 8192, "val_tokens": 1024, "manifest": "m"}
    monkeypatch.setattr(cli.stages, "run_flow", lambda *a, **kw: flows_run.append(a) or (None, answer))
    sets = {"data.source": str(tmp_path / "removed.jsonl"), "runtime.work_dir": str(tmp_path / "work")}
    write_dataset(resolve_config("smoke", sets, root=str(tmp_path / "root")))
    out = CliRunner().invoke(app, ["prepare", "--preset", "smoke", "--root", str(tmp_path / "root"),
                                   *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]])
    assert out.exit_code == 0, out.output
    assert len(flows_run) == 1


@pytest.mark.parametrize("under", [False, True])
def test_a_root_that_is_a_file_is_called_a_file(under, tmp_path, monkeypatch):
    """#64 item 8: it was called "not writable ... a read-only root", which sends one to permissions."""
    import cli.stages

    monkeypatch.setattr(cli.stages, "run_flow", lambda *a, **kw: pytest.fail("a stage ran"))
    (tmp_path / "notes.txt").write_text("not a folder")
    root = tmp_path / "notes.txt" / "root" if under else tmp_path / "notes.txt"
    out = CliRunner().invoke(app, ["train", "--preset", "smoke", "--root", str(root)])
    assert out.exit_code == 1, out.output
    assert ("lies under a file" if under else "is a file, not a folder") in out.output
    assert "not writable" not in out.output


@pytest.mark.parametrize("command", ["train", "run"])
def test_a_missing_local_init_from_is_answered_before_any_server_or_stage(command, tmp_path, monkeypatch):
    """#60: weights to start from that are not there are named in the command's first second, not
    after a pipeline's data stage."""
    import cli.stages
    from gpt2.config.overrides import resolve_config

    flows_run = []
    monkeypatch.setattr(cli.stages, "run_flow", lambda *a, **kw: flows_run.append(a))
    sets = {"train.init_from": str(tmp_path / "no-such-gpt2"), "runtime.work_dir": str(tmp_path / "work")}
    write_dataset(resolve_config("smoke", sets, root=str(tmp_path / "root")))  # `train` asks for prepared data first
    out = CliRunner().invoke(app, [command, "--preset", "smoke", "--root", str(tmp_path / "root"),
                                   *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]])
    assert out.exit_code == 1, out.output
    assert out.output.startswith(f"error: train.init_from={tmp_path / 'no-such-gpt2'}: ") and \
        out.output.count("does not exist") == 1, out.output
    assert flows_run == []
