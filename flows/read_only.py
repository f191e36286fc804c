"""What a read-only root answers: finished work, read from what the root
holds, with no server, no lease and nothing written.

A root can be read-only to the one asking: a bucket shared with read-only
credentials, a finished run's directory mounted read-only. A stage there
can only be answered when its work is all there, so each stage here reads
what its flow would have found cached (the manifest, the task's result
record under `<root>/.prefect/results`), checks it the same way the flow
checks a cached result (the final checkpoint verifies, the exports are
whole, the registered version exists), and returns what the flow returns,
with `read_only: true`. Anything missing is one error that names the root,
the missing piece, and what to do: nothing waits on a server or retries
a write first.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from gpt2.config.tree import Config
from gpt2.data.epoch import steps_for_checkpoint, with_resolved_steps
from gpt2.errors import UserError
from gpt2.root import layout, storage
from gpt2.weights.init import with_resolved_init


class NotAnswered(UserError):
    """The root is read-only and does not hold this command's finished work."""


class _Missing(Exception):
    pass


def _record_url(task: Any, config: Config, **params: Any) -> str:
    """Where a task's result record is kept: its cache key, as the task computes it."""
    return storage.join(layout.prefect_results(config), task.cache_key_fn(None, {"config": config, **params}))


def recorded(task: Any, config: Config, **params: Any) -> Any:
    """The result a cached task would return, or raises _Missing. Only this
    pipeline's JSON records are read, as tasks.results reads them."""
    from tasks.results import RefusedResult, RootJSONSerializer, check_record

    url = _record_url(task, config, **params)
    try:
        content = storage.read_bytes(url)
    except FileNotFoundError:
        raise _Missing(f"no finished {task.name} result for it ({url} does not exist)") from None
    except OSError as err:  # a root that is not a directory, one that cannot be read
        raise _Missing(f"its {task.name} result cannot be read ({type(err).__name__}: {err})") from None
    try:
        check_record(content, url)
    except RefusedResult as err:
        raise _Missing(str(err)) from None
    return RootJSONSerializer().loads(json.loads(content)["result"].encode())


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise _Missing(what)


def data(config: Config) -> dict[str, Any]:
    from flows.data import data_run_name
    from gpt2.data.llmc import ShardError
    from gpt2.data.prepare import summarize
    from tasks import data as steps
    from tasks.tracking import finished_stage_run

    try:
        result = summarize(layout.manifest(config)).model_dump()
    except (FileNotFoundError, ShardError) as err:
        raise _Missing(f"no complete prepared data ({err})") from None
    result.update(cached=True, read_only=True, cached_steps=sorted(
        name for name in ("download", "tokenize", "shard", "upload")
        if storage.exists(_record_url(getattr(steps, name), config))))
    # The MLflow run that recorded this data, as the flow answers a cached stage (reading only).
    result["mlflow_run_id"] = finished_stage_run(config, data_run_name(config), "data")
    return result


def train(config: Config, fresh: bool = False) -> dict[str, Any]:
    from flows.train import final_checkpoint
    from gpt2.checkpoint import store
    from tasks.train import train as train_task

    if fresh:
        raise NotAnswered(f"--fresh deletes this run's checkpoints, and artifact root {layout.root(config)} "
                          "is not writable: pass a writable --root")
    config = with_resolved_init(with_resolved_steps(config), fetching=False)
    result = recorded(train_task, config, parent_run_id=None, tags=None)
    try:  # what the training flow asks of a cached result
        final = final_checkpoint(config, result)
    except store.CheckpointError as err:
        raise _Missing(f"the final checkpoint is damaged ({err})") from None
    _check(final is not None,
           f"the training run {layout.run_name(config)} is not finished (its newest checkpoint is not the final one)")
    return {**result, "cached": True, "read_only": True}


def _ref(config: Config, checkpoint: str | None):
    """The config and checkpoint as the evaluate and export flows resolve them."""
    from gpt2.checkpoint.ref import resolve_checkpoint

    config = with_resolved_init(steps_for_checkpoint(config, checkpoint), fetching=False,
                                required=checkpoint in (None, "", "latest"))
    return config, resolve_checkpoint(config, checkpoint)


def evaluate(config: Config, checkpoint: str | None = "latest") -> dict[str, Any]:
    from tasks.evaluate import evaluate_hellaswag

    config, ref = _ref(config, checkpoint)
    result = recorded(evaluate_hellaswag, config, ref=ref)
    _check(storage.exists(result["result_url"]), f"the evaluation's result {result['result_url']} is gone")
    return {**result, "cached": True, "read_only": True}


def export(config: Config, checkpoint: str | None = "latest") -> dict[str, Any]:
    from gpt2.export.writer import export_complete
    from tasks.export import export_checkpoint, register_model
    from tasks.registry import model_version_exists

    config, ref = _ref(config, checkpoint)
    files = recorded(export_checkpoint, config, ref=ref)
    _check(export_complete(files["export_dir"], ref), f"the export {files['export_dir']} is incomplete")
    entry = recorded(register_model, config, ref=ref, export=files)  # its key follows the export's model card
    _check(model_version_exists(config, entry["registered_model"], entry["model_version"]),
           f"registered model {entry['registered_model']} v{entry['model_version']} is not in MLflow")
    return {**files, **entry, "cached": True, "read_only": True}


def pipeline(config: Config) -> dict[str, Any]:
    from flows.pipeline import STAGES, pipeline_bill, summarize

    results = {"data": data(config)}
    config = with_resolved_steps(config)  # as the parent pins train.max_steps=epoch after the data stage
    results.update(train=train(config), evaluate=evaluate(config), export=export(config))
    summary = summarize(results, None)  # no pipeline run of its own: nothing is written
    summary["bill"] = pipeline_bill(config, results, {s: 0.0 for s in STAGES})
    summary["mlflow_url"] = _train_run_link(config, results["train"].get("mlflow_run_id"))
    summary["read_only"] = True
    return summary


def _train_run_link(config: Config, run_id: str | None) -> str | None:
    """The MLflow UI's page of the training run (read from the store, never
    written): the pipeline wrote no run of its own to link to."""
    from mlflow import MlflowClient

    from gpt2.tracking.experiment import ui_link
    from gpt2.tracking.store import default_tracking_uri

    uri = default_tracking_uri(config)
    try:
        experiment = MlflowClient(uri).get_run(run_id).info.experiment_id if run_id else None
    except Exception:  # noqa: BLE001 - a link is a convenience; the answer stands without it
        return None
    return ui_link(uri, experiment, run_id)


STAGES: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "flows.data:data_flow": ("prepared data", data),
    "flows.train:train_flow": ("finished training run", train),
    "flows.evaluate:eval_flow": ("evaluation", evaluate),
    "flows.export:export_flow": ("export", export),
    "flows.pipeline:pipeline_flow": ("finished pipeline", pipeline),
}


def answer(entrypoint: str, config: Config, why: str, **kwargs: Any) -> dict[str, Any]:
    """The flow's result for finished work on a root that cannot be written
    (`why` says so, naming the root); NotAnswered when the work is not all there."""
    what, stage = STAGES[entrypoint]
    try:
        return stage(config, **kwargs)
    except NotAnswered:
        raise
    except (_Missing, OSError, UserError) as err:
        raise NotAnswered(f"{why}. A read-only root answers only finished work, and this config's {what} is not "
                          f"all there: {err}. Pass a writable --root to do the rest") from None
