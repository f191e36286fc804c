"""The trainer in-process on CPU: results, checkpoints, MLflow, resume, failures."""

from __future__ import annotations

import shutil
import socket

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file

from gpt2.checkpoint import store
from gpt2.config.identity import train_fingerprint
from gpt2.model import GPT
from gpt2.root import layout, storage
from gpt2.tracking.store import default_tracking_uri
from gpt2.train.attempts import read_attempts
from gpt2.train.memory import cpu_limit
from gpt2.train.run import train
from gpt2.train.session import TrainingError
from gpt2.train.startup import PARTS, process_started
from tests.gpt2.train.fixtures import tiny_config, write_dataset

# One pytest worker runs this module (--dist loadgroup): its module-scoped fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("train")


def weights(url: str) -> dict[str, torch.Tensor]:
    # Cloned: load_file may map the file, and tests rewrite checkpoint files.
    return {k: v.clone() for k, v in load_file(storage.local_path(storage.join(url, "model.safetensors"))).items()}


def assert_same_weights(a: str, b: str) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


IN_LOOP_HELLASWAG = {"eval.every_steps": 3, "eval.limit": 8}  # steps 3, 6 and the last, 8


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One uninterrupted 8-step run; tests copy its root before changing it."""
    root = tmp_path_factory.mktemp("finished")
    # In-loop HellaSwag on the format sample; eval settings are not part of
    # the training identity, so tiny_config(root) names the same run.
    config = tiny_config(root, **IN_LOOP_HELLASWAG)
    write_dataset(config)
    return root, train(config)


def copy_root(finished, tmp_path):
    src, _ = finished
    dst = tmp_path / "root"
    shutil.copytree(src, dst)
    return tiny_config(dst)


def test_run_reports_checkpoints_and_learns(finished):
    root, result = finished
    config = tiny_config(root, **IN_LOOP_HELLASWAG)
    assert result.steps == 8 and result.resumed_from_step == 0 and result.world_size == 1
    assert result.checkpoint == layout.checkpoint_dir(layout.run_dir(config), 8)
    assert result.run_name == layout.run_name(config)
    # keep_checkpoints=3 of the four written (every 2 steps)
    assert [u.rsplit("/", 1)[1] for u in store.complete_checkpoints(config)] == [
        "step_000008", "step_000006", "step_000004"]
    state = storage.read_json(storage.join(result.checkpoint, "state.json"))
    assert state["step"] == 8 and state["config"] == config.model_dump(mode="json")
    assert state["train_fingerprint"] == train_fingerprint(config)
    assert state["val_loss"] == result.final_val_loss and state["mlflow_run_id"] == result.mlflow_run_id
    assert state["loader"] == {"shard": 0, "offset": 8 * 256, "epoch": 0}
    history = state["history"]["train"]
    assert history[-1][1] < history[0][1] - 0.2  # the synthetic phrases are learnable
    assert result.tokens_per_second > 0


def test_mlflow_run_has_params_metrics_and_artifacts(finished):
    root, result = finished
    config = tiny_config(root)
    client = MlflowClient(default_tracking_uri(config))
    run = client.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == "0.003" and run.data.params["model.n_layer"] == "2"
    assert run.data.tags["stage"] == "train"
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in losses] == list(range(1, 9))
    val = client.get_metric_history(run.info.run_id, "val/loss")
    assert [m.step for m in val] == [4, 8] and val[-1].value == result.final_val_loss
    assert {"train/lr", "train/grad_norm", "perf/tokens_per_second", "perf/data_wait_s"} <= set(run.data.metrics)
    waits = client.get_metric_history(run.info.run_id, "perf/data_wait_s")
    assert [m.step for m in waits] == list(range(1, 9)) and waits[0].value > 0  # step 1 opened its shard
    # tokens/s times the whole iteration, batch fetch included: no step took less than its data wait.
    speeds = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "perf/tokens_per_second")}
    assert all(speeds[m.step] * m.value <= config.train.total_batch_tokens for m in waits)
    hellaswag = client.get_metric_history(run.info.run_id, "hellaswag/acc_norm")
    assert [m.step for m in hellaswag] == [3, 6, 8] and all(0 <= m.value <= 1 for m in hellaswag)
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "loss_curve.png", "samples"} <= names
    assert run.info.artifact_uri.startswith(storage.normalize_url(str(root)))


def test_rerun_of_a_finished_run_changes_nothing(finished, tmp_path):
    config = copy_root(finished, tmp_path)
    _, first = finished
    again = train(config)
    assert again.resumed_from_step == 8 and again.steps == 8
    assert again.final_val_loss == first.final_val_loss and again.mlflow_run_id == first.mlflow_run_id


def test_corrupt_latest_checkpoint_falls_back_and_ends_identically(finished, tmp_path, caplog):
    config = copy_root(finished, tmp_path)
    _, first = finished
    latest = store.latest_checkpoint(config)
    expected = weights(latest)
    path = storage.local_path(storage.join(latest, "model.safetensors"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))
    result = train(config)
    assert "falling back" in caplog.text
    assert result.resumed_from_step == 6 and result.steps == 8
    assert result.final_val_loss == first.final_val_loss
    got = weights(result.checkpoint)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_each_attempt_records_its_start_up_part_by_part(finished, tmp_path):
    """imports, lease, data, checkpoint, probe, compile, first_step, other: in the
    attempt record and in MLflow, adding up to the start-up."""
    config = copy_root(finished, tmp_path)
    _, first = finished
    shutil.rmtree(storage.local_path(store.latest_checkpoint(config)))  # as if killed after step 6's checkpoint
    train(config)
    fresh, resumed = read_attempts(layout.run_dir(config))
    for record in (fresh, resumed):
        parts = record["startup_parts"]
        assert set(parts) == set(PARTS) and all(v >= 0 for v in parts.values())
        assert parts["imports"] > 0 and parts["data"] > 0 and parts["first_step"] > 0
        assert parts["compile"] == 0  # eager on CPU: nothing compiled, nothing loaded
    # From the process's start to the first step's end, every second in one part.
    parts = resumed["startup_parts"]
    assert sum(parts.values()) == pytest.approx(resumed["first_step_at"] - process_started(), abs=0.1)
    assert parts["checkpoint"] > fresh["startup_parts"]["checkpoint"]  # a resume reads one
    metrics = MlflowClient(default_tracking_uri(config)).get_run(first.mlflow_run_id).data.metrics
    assert {f"startup/{p}" for p in PARTS} <= set(metrics)


def test_fresh_starts_over_with_a_new_mlflow_run(finished, tmp_path):
    config = copy_root(finished, tmp_path)
    _, first = finished
    result = train(config, fresh=True)
    assert result.resumed_from_step == 0 and result.steps == 8
    assert result.mlflow_run_id != first.mlflow_run_id
    assert result.final_val_loss == first.final_val_loss  # same seed, same data: same run


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    # An absurd learning rate: after one update the weights are ~1e30 and the
    # next forward pass overflows float32.
    config = tiny_config(tmp_path, **{"train.lr": 1e30, "train.warmup_steps": 0, "train.checkpoint_every": 1,
                                      "train.grad_clip": 0.0})
    write_dataset(config)
    with pytest.raises(TrainingError, match=r"loss is (nan|inf) at step 2 of 8") as err:
        train(config)
    assert "step_000001" in str(err.value)
    assert store.latest_checkpoint(config).endswith("step_000001")


def test_out_of_memory_mid_run_names_the_setting(tmp_path):
    config = tiny_config(tmp_path, **{"runtime.memory_limit_mb": 60, "train.micro_batch_size": 8})
    write_dataset(config)
    with pytest.raises(TrainingError, match=r"train\.micro_batch_size") as err:
        train(config)
    assert "step 1" in str(err.value) and "runtime.memory_limit_mb=60" in str(err.value)
    assert store.latest_checkpoint(config) is None


def _fits(config, batch: int) -> bool:
    torch.manual_seed(0)
    model = GPT(config.model)
    x = torch.randint(0, 50257, (batch, config.model.block_size))
    try:
        with cpu_limit(model, torch.device("cpu"), config.runtime.memory_limit_mb):
            _, loss = model(x, x)
        loss.backward()
        return True
    except torch.OutOfMemoryError:
        return False


def test_auto_micro_batch_picks_the_largest_size_that_fits(tmp_path):
    config = tiny_config(tmp_path, **{"runtime.memory_limit_mb": 60, "train.micro_batch_size": "auto",
                                      "train.max_steps": 2, "train.checkpoint_every": 2})
    write_dataset(config)
    result = train(config)
    chosen = result.micro_batch_size
    assert 1 <= chosen < 8 and 8 % chosen == 0
    assert _fits(config, chosen) and not _fits(config, 2 * chosen)
    assert result.steps == 2  # and training ran with it under the same limit


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tracking_outage_does_not_stop_training(tmp_path, monkeypatch, caplog):
    # Nothing listens on the port: every MLflow request fails. No client-side
    # retries, so the test measures our handling rather than urllib3's backoff.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    config = tiny_config(tmp_path, **{"tracking.uri": f"http://127.0.0.1:{_closed_port()}", "train.max_steps": 4})
    write_dataset(config)
    result = train(config)
    assert result.steps == 4 and result.final_val_loss is not None
    assert store.latest_checkpoint(config).endswith("step_000004")
    assert result.mlflow_run_id is None
    assert "unavailable" in caplog.text and "not sent" in caplog.text


def test_settings_that_never_change_the_weights_continue_the_same_run(finished, tmp_path):
    """As the OOM error advises: a smaller micro-batch (and other intervals) resumes, never restarts."""
    config = copy_root(finished, tmp_path)
    _, first = finished
    for url in store.complete_checkpoints(config)[:-1]:  # keep step 4 only: there is training left to do
        shutil.rmtree(storage.local_path(url))
    changed = tiny_config(tmp_path / "root", **{"train.micro_batch_size": 2, "train.checkpoint_every": 3,
                                                "train.keep_checkpoints": 1, "train.eval_every": 3,
                                                "train.sample_every": 5})
    assert layout.run_dir(changed) == layout.run_dir(config)
    result = train(changed)
    assert result.resumed_from_step == 4 and result.micro_batch_size == 2 and result.steps == 8
    assert result.mlflow_run_id == first.mlflow_run_id
    # Four micro-batches of 2 sum the same gradient as two of 4, up to float rounding.
    assert result.final_val_loss == pytest.approx(first.final_val_loss, abs=1e-4)


def test_a_run_named_by_an_earlier_release_is_continued(finished, tmp_path, caplog):
    config = copy_root(finished, tmp_path)
    _, first = finished
    legacy = layout.legacy_run_dir(config)
    assert legacy != layout.run_dir(config)
    shutil.move(storage.local_path(layout.run_dir(config)), storage.local_path(legacy))
    for url in store.complete_checkpoints(legacy)[:-1]:
        shutil.rmtree(storage.local_path(url))
    result = train(config)
    assert result.resumed_from_step == 4 and "named by an earlier release" in caplog.text
    assert result.checkpoint.startswith(layout.run_dir(config))
    assert result.final_val_loss == first.final_val_loss


def test_a_new_run_names_a_sibling_with_the_same_model_and_data(finished, tmp_path, caplog):
    config = copy_root(finished, tmp_path)
    other = tiny_config(tmp_path / "root", **{"train.lr": 1e-3, "train.max_steps": 1})
    train(other)
    sibling = layout.run_name(config)
    assert f"run {sibling} has the same model and data (step 8) and differs in train.lr" in caplog.text


def test_a_trainer_that_died_before_its_first_checkpoint_leaves_its_mlflow_run_to_the_next(tmp_path, monkeypatch):
    """The fault soak's defect: an attempt died on a full disk at its first
    checkpoint; the next started at step 0 with no checkpoint to name its MLflow
    run and opened a second run for the same training run (gpt2.train.mlflow_run)."""
    import errno

    config = tiny_config(tmp_path, **{"train.checkpoint_every": 4})
    write_dataset(config)
    write_blobs = store.write_blobs

    def full_disk(url, blobs):
        raise OSError(errno.ENOSPC, "No space left on device", url)

    monkeypatch.setattr(store, "write_blobs", full_disk)
    with pytest.raises(Exception, match="No space left on device"):
        train(config)
    assert store.latest_checkpoint(config) is None
    client = MlflowClient(default_tracking_uri(config))

    def train_runs():
        return [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
                if r.data.tags.get("stage") == "train"]

    (cut_short,) = train_runs()
    assert [m.step for m in client.get_metric_history(cut_short.info.run_id, "train/loss")] == [1, 2, 3, 4]

    monkeypatch.setattr(store, "write_blobs", write_blobs)  # space freed
    result = train(config)
    assert result.resumed_from_step == 0 and result.mlflow_run_id == cut_short.info.run_id
    assert [r.info.run_id for r in train_runs()] == [cut_short.info.run_id]
    for key in ("train/loss", "train/lr", "train/grad_norm"):
        assert [m.step for m in client.get_metric_history(result.mlflow_run_id, key)] == list(range(1, 9)), key
