"""Every path under the artifact root and the local work dir, from a config.

The one place that knows where things live; every other module asks here.
Names are readable plus a short identity hash (gpt2.config.identity), so a path
changes only when what it holds would:

    <root>/
      data/<name>-<data fp>/            manifest.json + llm.c shards
      weights/<name>-<source hash>/     train.init_from's weights, fetched once (gpt2.weights.init)
      eval-bundles/<name>-<source hash>/  eval.core_bundle's CORE tasks, fetched once (gpt2.eval.core.fetch)
      staging/<name>-tokenize-<fp>/     token units written by a Dask cluster's workers
      runs/<name>-<train fp>/           one training run
        checkpoints/step_000500/        a checkpoint (gpt2.checkpoint.store)
        lease/000001.json               who trains this run (gpt2.checkpoint.lease)
        attempts/000001.json            one training attempt: when, where, steps, its end (gpt2.train.attempts)
        eval/step_000500/hellaswag.json
        eval/step_000500/tasks/<settings hash>/<task>.json   one task's result (an evaluation resumes by them)
        export/step_000500/{hf,llmc}/
      pipeline/parents/<flow run>.json  the parent flow's MLflow run id
      pipeline/stage-results/<flow run>.json
      pipeline/train-jobs/<job>/node-<i>.json  a multi-node Job's node outcome (gpt2.launch.node)
      mlflow.db, mlflow-artifacts/      the embedded MLflow store (local roots)
      .prefect/results/                 Prefect task results

    <work dir>/
      data/<name>-<step>-<step fp>/     the data steps' local outputs
      shards/<name>/                    remote shards cached for training
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from pathlib import Path

from gpt2.config.identity import data_fingerprint, data_step_fingerprint, legacy_train_fingerprint, train_fingerprint
from gpt2.config.tree import Config
from gpt2.root import storage

MANIFEST_NAME = "manifest.json"
HASH_CHARS = 12
"""Characters of an identity hash in a directory name."""


def root(config: Config) -> str:
    """The artifact root as an absolute URL (local paths become file://…)."""
    return storage.normalize_url(config.runtime.root)


# --- data -----------------------------------------------------------------


def data_dir(config: Config) -> str:
    """Where a config's shards live: readable name + short identity hash."""
    return storage.join(root(config), "data", f"{config.data.name}-{data_fingerprint(config)[:HASH_CHARS]}")


def manifest(config: Config) -> str:
    return storage.join(data_dir(config), MANIFEST_NAME)


def shard(manifest_url: str, name: str) -> str:
    """A shard named in a manifest lives beside it."""
    return storage.join(posixpath.dirname(manifest_url), name)


def unit_staging_dir(config: Config) -> str:
    """Where a cluster's workers write token units (runtime.data_cluster):
    under the root, which every worker reaches, unlike this machine's work
    dir. Named by the tokenize step's identity; removed once the shards are
    in the root."""
    name = f"{config.data.name}-tokenize-{data_step_fingerprint(config, 'tokenize')[:HASH_CHARS]}"
    return storage.join(root(config), "staging", name)


def data_step_dir(config: Config, step: str) -> Path:
    """Local scratch directory of one data step's outputs, named by that step's identity."""
    name = f"{config.data.name}-{step}-{data_step_fingerprint(config, step)[:HASH_CHARS]}"
    return config.runtime.work_root / "data" / name


def shard_cache_dir(config: Config, dataset_name: str, fingerprint: str) -> Path:
    """Local copies of a remote root's shards, for the trainer: one directory
    per dataset identity, files named by content (gpt2.data.shard_source)."""
    return config.runtime.work_root / "shards" / f"{dataset_name}-{fingerprint[:HASH_CHARS]}"


def checkpoint_staging_dir(config: Config) -> str:
    """Where a run's checkpoints are written locally before their upload to the
    root (a file:// URL under the work dir; gpt2.checkpoint.staging). Keyed by
    the root as well as the run: the run's name is the same on every root, and
    one machine may train it for two roots (a bucket and a local try)."""
    return (config.runtime.work_root / "staged-checkpoints" / root_key(config) / run_name(config)).as_uri()


def attempt_progress_dir(config: Config) -> Path:
    """This machine's per-step progress of the run's attempts (gpt2.train.attempts),
    keyed by the root as well as the run, like the staging directory."""
    return config.runtime.work_root / "attempts" / root_key(config) / run_name(config)


def legacy_checkpoint_staging_dir(config: Config) -> str:
    """Where releases before root-keyed staging kept a run's local copies (the run's name alone)."""
    return (config.runtime.work_root / "staged-checkpoints" / run_name(config)).as_uri()


def root_key(config: Config) -> str:
    """A directory name for the root: the hash of its normalized URL."""
    return "root-" + hashlib.sha256(root(config).encode()).hexdigest()[:HASH_CHARS]


# --- weights to start from --------------------------------------------------


def init_weights_dir(root_url: str, source: str) -> str:
    """Where train.init_from's weights are kept once fetched: named by the source
    (its last path part, readable, and the hash of its normalized URL), so every
    run that starts from it finds the copy without reading the source again."""
    return _fetched_dir(root_url, "weights", source)


def core_bundle_dir(root_url: str, source: str) -> str:
    """Where eval.core_bundle's files are kept once fetched, named by the source as the
    weights are, so every evaluation under the root reads the copy."""
    return _fetched_dir(root_url, "eval-bundles", source)


def _fetched_dir(root_url: str, kind: str, source: str) -> str:
    url = storage.normalize_url(source)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").rsplit("/", 1)[-1])[:40] or kind
    return storage.join(storage.normalize_url(root_url), kind,
                        f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:HASH_CHARS]}")


# --- training runs and checkpoints ----------------------------------------


def run_name(config: Config) -> str:
    """A training run's name: depends on the training identity only, so the
    device, the GPU count or the root's location never orphan a run."""
    return f"{config.data.name}-{train_fingerprint(config)[:HASH_CHARS]}"


def run_dir(config: Config) -> str:
    return run_dir_under(root(config), run_name(config))


def legacy_run_dir(config: Config) -> str:
    """Where releases before 0.2 kept this run (their name counted settings
    that never change the weights)."""
    return run_dir_under(root(config), f"{config.data.name}-{legacy_train_fingerprint(config)[:HASH_CHARS]}")


def runs_dir(config: Config) -> str:
    return storage.join(root(config), "runs")


def run_dir_under(root_url: str, name: str) -> str:
    return storage.join(storage.normalize_url(root_url), "runs", name)


def checkpoints_dir(run_dir_url: str) -> str:
    return storage.join(run_dir_url, "checkpoints")


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_dir(run_dir_url: str, step: int) -> str:
    return storage.join(checkpoints_dir(run_dir_url), step_name(step))


def lease_dir(run_dir_url: str) -> str:
    """The run's lease generations (gpt2.checkpoint.lease)."""
    return storage.join(run_dir_url, "lease")


def attempts_dir(run_dir_url: str) -> str:
    """The run's training attempts, one record each (gpt2.train.attempts)."""
    return storage.join(run_dir_url, "attempts")


def attempt_record(run_dir_url: str, number: int) -> str:
    return storage.join(attempts_dir(run_dir_url), f"{number:06d}.json")


def tracking_record(run_dir_url: str) -> str:
    """The run's MLflow run id, written when its first trainer opens it: a trainer
    that starts without a checkpoint (the last one died before its first) reopens
    that run instead of opening a second (gpt2.train.loop; --fresh removes it)."""
    return storage.join(run_dir_url, "mlflow-run.json")


def fresh_marker(run_dir_url: str, flow_run_id: str | None) -> str:
    """Records that one flow run already applied --fresh (it must not twice)."""
    return storage.join(run_dir_url, f".fresh-{flow_run_id or 'local'}")


def eval_task_result(eval_dir_url: str, settings: str, task: str) -> str:
    """One task's result of an evaluation (`settings`: the hash of what defines it), written when
    the task is scored, so a preempted evaluation resumes without scoring it again."""
    return storage.join(eval_dir_url, "tasks", settings, re.sub(r"[^A-Za-z0-9._-]+", "_", task) + ".json")


def stage_output_dir(root_url: str, run: str, stage: str, step: int) -> str:
    """What a stage derives from one checkpoint: runs/<run>/<stage>/step_NNNNNN."""
    return storage.join(run_dir_under(root_url, run), stage, step_name(step))


# --- orchestration and tracking -------------------------------------------


def prefect_results(config: Config) -> str:
    return storage.join(root(config), ".prefect", "results")


def stage_result(config: Config, flow_run_id: str) -> str:
    """A stage flow run's small JSON result, for a parent on another machine."""
    return storage.join(root(config), "pipeline", "stage-results", f"{flow_run_id}.json")


def parent_record(config: Config, flow_run_id: str) -> str:
    """The parent flow run's MLflow run id, so a rescheduled parent reopens it."""
    return storage.join(root(config), "pipeline", "parents", f"{flow_run_id}.json")


def node_outcome(config: Config, job: str, index: int) -> str:
    """Where node `index` of multi-node training Job `job` records its outcome
    (gpt2.launch.node writes it, gpt2.launch.k8s_status reads it)."""
    return storage.join(root(config), "pipeline", "train-jobs", job, f"node-{index}.json")


def ladder_record(config: Config, parent_flow_run_id: str, stage: str) -> str:
    """The rungs a pipeline's GPU stage left and why (gpt2.ladder), so a
    restarted parent carries on from the rung it was on."""
    return storage.join(root(config), "pipeline", "ladders", f"{parent_flow_run_id}-{stage}.json")


def left_run_marker(root_url: str, flow_run_id: str) -> str:
    """Written before the ladder cancels a stage's run on a rung it leaves: that
    run, if it starts anyway (the race), stops before training or evaluating."""
    return storage.join(root_url, "pipeline", "left-runs", str(flow_run_id))


def local_root(config: Config) -> Path | None:
    """The root as a local directory, None for remote roots (by scheme, not
    via fsspec: instantiating a cloud filesystem may probe for credentials)."""
    url = root(config)
    return Path(url[len("file://"):]) if url.startswith("file://") else None


def mlflow_db(config: Config) -> Path:
    """The embedded SQLite tracking store: beside a local root, else in the work dir."""
    return (local_root(config) or config.runtime.work_root) / "mlflow.db"


def mlflow_artifacts(config: Config) -> str:
    """Experiment artifacts under the root when MLflow can write there (file,
    gs, s3); other roots use the work dir."""
    url = root(config)
    if url.split("://", 1)[0] in ("file", "gs", "s3"):
        return storage.join(url, "mlflow-artifacts")
    return (config.runtime.work_root / "mlflow-artifacts").as_uri()
