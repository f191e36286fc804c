"""An `s3://` root for real: a local S3 server (moto's server mode) on
loopback through s3fs, the way `gs://` is tested against the GCS emulator.
The data stage writes its shards there, training reads them and checkpoints
there, a rerun after a lost final checkpoint resumes from the one before, and
the export writes the Hugging Face directory beside them."""

from __future__ import annotations

import fsspec

from gpt2.checkpoint import store
from gpt2.checkpoint.ref import resolve_checkpoint
from gpt2.config.overrides import resolve_config
from gpt2.data import prepare
from gpt2.data.manifest import verify_manifest
from gpt2.export.writer import export_checkpoint
from gpt2.train.run import train

TINY_ON_SMOKE_DATA = {
    "model.n_layer": 1, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
    "train.total_batch_tokens": 256, "train.micro_batch_size": 4, "train.max_steps": 4,
    "train.warmup_steps": 1, "train.eval_every": 4, "train.val_steps": 1, "train.sample_every": 4,
    "train.checkpoint_every": 2, "eval.every_steps": 0, "tracking.enabled": False, "runtime.device": "cpu",
}


def test_prepare_train_resume_and_export_on_an_s3_root(s3_server, tmp_path):
    config = resolve_config("smoke", {"runtime.work_dir": str(tmp_path / "w"), **TINY_ON_SMOKE_DATA},
                            root=s3_server)
    data = prepare.prepare_data(config, show_progress=False)
    assert data.manifest.startswith("s3://gpt2-test-bucket/prefix/data/")
    assert verify_manifest(data.manifest, checksum=True).split("train")

    first = train(config)
    assert first.steps == 4 and first.checkpoint.startswith("s3://gpt2-test-bucket/prefix/runs/")
    fs = fsspec.filesystem("s3")
    # As if the machine was lost before step 4's checkpoint reached the bucket.
    fs.rm(first.checkpoint.removeprefix("s3://"), recursive=True)
    assert store.latest_checkpoint(config).endswith("step_000002")
    resumed = train(config)
    assert resumed.resumed_from_step == 2 and resumed.steps == 4
    assert resumed.final_train_loss == first.final_train_loss  # bit for bit on CPU, through the bucket

    exported = export_checkpoint(resolve_checkpoint(config), s3_server, tmp_path / "export-work")
    assert exported.hf_dir.startswith("s3://gpt2-test-bucket/prefix/")
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(exported.hf_dir.removeprefix("s3://"))}
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt"} <= names
