"""Parent flow `gpt2` (deployment `gpt2/full-pipeline`): prepare → train →
evaluate → export, with a parent MLflow run and a child run per stage; the
parent run ends with `report.png`, the runs report (tasks.runs_report).

    prefect deployment run gpt2/full-pipeline -p preset=smoke    # on the work pools
    gpt2 run --preset smoke                                      # in this process

Run from a deployment, each stage runs as its own deployment on the pool that
fits its hardware (data and export on `cpu`, train and evaluate on `gpu`), so
the GPU machine only trains and evaluates. Run locally, the stage flows run
in-process as subflows. Either way every stage is cached, so a rerun only
does what is missing.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import deployment, flow_run

from flows.entry import flow_main
from flows.stages import publish_result, run_stage_deployment, stage_overrides
from flows.summary import SUMMARY_RECORD, where_things_are
from gpt2.config.overrides import resolve_config
from gpt2.config.tree import Config
from gpt2.data.epoch import EPOCH, with_resolved_steps
from gpt2.errors import UserError
from gpt2.eval.core.fetch import for_training as core_bundle_for_training
from gpt2.ladder import rungs
from gpt2.process import signals
from gpt2.root import layout, storage
from gpt2.secrets import redact
from gpt2.tracking.experiment import ui_link
from gpt2.tracking.tracker import Tracker
from gpt2.train import bill
from gpt2.weights.init import with_resolved_init
from tasks.tracking import run_under, stage_run

STAGES = ("data", "train", "evaluate", "export")


def _parent_record(config: Config) -> str | None:
    if not flow_run.id:
        return None
    return layout.parent_record(config, str(flow_run.id))


def parent_tracker(config: Config, preset: str, parent_run_id: str | None = None, kind: str = "pipeline") -> Tracker:
    """The pipeline's MLflow run (a sweep's: `kind` sweep), a child of `parent_run_id` when
    given (a sweep's member); a retried or rescheduled parent flow run reopens the run it
    created before instead of starting a second one."""
    record = _parent_record(config)
    run_id = (storage.read_record(record) or {}).get("mlflow_run_id") if record else None
    tracker = stage_run(config, f"{kind}-{preset}-{flow_run.name or 'local'}", kind, parent_run_id=parent_run_id,
                        run_id=run_id, tags={"preset": preset})
    if record and tracker.run_id and run_id is None:
        storage.write_record(record, {"mlflow_run_id": tracker.run_id})
    return tracker


class LadderInProcess(UserError):
    """runtime.gpu_pools given to a pipeline that runs its stages in this process."""


def check_ladder(config: Config) -> None:
    """A ladder of GPU pools is a choice of deployments: refused, by name, where
    the stages run in this process, and checked against the server's deployments
    before any stage starts."""
    if not config.runtime.gpu_pools:
        return
    if not deployment.id:
        raise LadderInProcess(rungs.IN_PROCESS)
    from flows.ladder import check_deployed

    check_deployed(config)


def _run_stage(stage: str, config: Config, params: dict[str, Any], parent_run_id: str | None) -> dict[str, Any]:
    signals.stop_if_requested()  # a Ctrl-C Prefect swallowed as the last stage ended stops here
    if deployment.id:  # on the work pools: each stage as its own deployment
        stage_params = {**params, "overrides": stage_overrides(config, params["overrides"]),
                        "parent_run_id": parent_run_id}
        return run_stage_deployment(stage, config, stage_params, parent_key=str(flow_run.id))
    return _local_stage(stage)(**params, parent_run_id=parent_run_id)


def _local_stage(stage: str):
    """The stage's flow, imported only when it runs in this process: on the work
    pools the parent never loads torch, transformers or the data libraries, so
    every start and restart of the parent's process stays quick."""
    if stage == "data":
        from flows.data import data_flow as stage_flow
    elif stage == "train":
        from flows.train import train_flow as stage_flow
    elif stage == "evaluate":
        from flows.evaluate import eval_flow as stage_flow
    else:
        from flows.export import export_flow as stage_flow
    return stage_flow


def pin_steps(config: Config, params: dict[str, Any]) -> Config:
    """After the data stage: `train.max_steps=epoch` resolved once, from the
    manifest it wrote, and pinned into the stages' overrides, so train,
    evaluate and export (on any machine) name the same run."""
    if config.train.max_steps != EPOCH:
        return config
    config = with_resolved_steps(config)
    params["overrides"] = {**params["overrides"], "train.max_steps": config.train.max_steps}
    get_run_logger().info("train.max_steps=epoch: %d steps (one pass over the prepared train split)",
                          config.train.max_steps)
    return config


def pin_init(config: Config, params: dict[str, Any]) -> Config:
    """train.init_from's weights fetched into the root once, here on the parent's (CPU) pool,
    and their sha256 pinned into the stages' overrides: train, evaluate and export (on any
    machine) name the same run, and the GPU machine reads the root's copy, never the source."""
    resolved = with_resolved_init(config)
    if resolved.train.init_sha256:  # with the vocabulary the weights gave: the overrides alone name the run
        params["overrides"] = {**params["overrides"], "train.init_sha256": resolved.train.init_sha256,
                               "model.vocab_size": resolved.model.vocab_size}
    return resolved


def report_runs(parent: Tracker, config: Config, train_run_id: str | None, logger: Any) -> None:
    """The runs report (this pipeline's training run beside the experiment's
    newest, validation loss and HellaSwag against the published numbers) as
    `report.png` on the parent run. A figure is a convenience: failing to draw
    it costs a warning, never the pipeline whose stages all succeeded."""
    if not parent.enabled:
        return
    try:
        from tasks.runs_report import pipeline_report

        report = pipeline_report(parent, config.tracking.experiment, train_run_id)
    except Exception as err:  # noqa: BLE001 - see the docstring
        logger.warning("runs report not drawn: %s: %s", type(err).__name__, redact(str(err)))
        return
    logger.info("runs report (%d run(s)) logged to MLflow run %s as report.png", len(report["runs"]), parent.run_id)
    for skip in report["skipped"]:
        logger.info("runs report skipped %s (%s)%s: %s", skip["name"], skip["run_id"],
                    f" on {skip['panel']}" if skip["panel"] else "", skip["reason"])


def summarize(results: dict[str, dict[str, Any]], parent_run_id: str | None) -> dict[str, Any]:
    train, evaluation, export = results["train"], results["evaluate"], results["export"]
    return {
        "mlflow_run_id": parent_run_id,
        "manifest": results["data"]["manifest"],
        "checkpoint": train.get("checkpoint"),
        "final_val_loss": train.get("final_val_loss"),
        "hellaswag": evaluation.get("hellaswag"),
        "core": evaluation.get("core"),
        "tasks": evaluation.get("tasks"),
        "hf_dir": export.get("hf_dir"),
        "llmc_bin": export.get("llmc_bin"),
        "registered_model": export.get("registered_model"),
        "model_version": export.get("model_version"),
        "cached_stages": [s for s in STAGES if results[s].get("cached")],
        # The ladder of GPU pools: per GPU stage, the rungs tried in order and why each was left.
        "rungs": {s: results[s]["rungs"] for s in ("train", "evaluate") if results[s].get("rungs")},
        "stage_mlflow_run_ids": {s: results[s].get("mlflow_run_id") for s in STAGES},
    }


def pipeline_bill(config: Config, results: dict[str, dict[str, Any]], seconds: dict[str, float]) -> dict[str, Any]:
    """What this pipeline run spent (gpt2.train.bill): the training run's bill when it
    trained here, evaluate on one GPU, data and export on the CPU machine; a
    cached stage ran nothing and adds nothing."""
    hours = {s: bill.stage_hours(seconds[s], bool(results[s].get("cached"))) for s in STAGES}
    train = None if results["train"].get("cached") else results["train"].get("bill")
    # On a ladder, evaluate is priced at the rung it completed on (the waits on rungs it left ran nothing).
    evaluated_on = (results["evaluate"].get("rungs") or [{}])[-1].get("pool")
    return bill.pipeline_bill(train, hours["data"] + hours["export"], hours["evaluate"],
                              rungs.price_for(config, evaluated_on), config.runtime.cpu_price_per_hour,
                              evaluated_on)


@flow(name="gpt2", log_prints=False)
def pipeline_flow(preset: str = "smoke", overrides: dict[str, Any] | None = None,
                  parent_run_id: str | None = None) -> dict[str, Any]:
    """The whole pipeline for a preset plus dotted-key overrides (e.g.
    {"runtime.root": "gs://bucket/gpt2", "train.max_steps": 100}); `parent_run_id`: the
    MLflow run it nests under (a sweep's, flows.sweep)."""
    overrides = dict(overrides or {})
    config = resolve_config(preset, overrides)
    logger = get_run_logger()
    check_ladder(config)
    params = {"preset": preset, "overrides": overrides}
    results: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    with parent_tracker(config, preset, parent_run_id) as parent:
        for stage in STAGES:
            started = time.perf_counter()
            results[stage] = run_under(parent, lambda under: _run_stage(stage, config, params, under))
            took = seconds[stage] = time.perf_counter() - started
            logger.info("stage %s %s in %.1f s", stage, "cached" if results[stage].get("cached") else "done", took)
            parent.log_metrics({f"stage_seconds/{stage}": took}, step=0)
            if stage == "data":
                config = pin_init(pin_steps(config, params), params)
                core_bundle_for_training(config)  # eval.core_every's CORE bundle, here on the CPU pool
                # Logged once the step count is known (MLflow never changes a param's value).
                parent.log_params(config.model_dump(mode="json"))
        summary = summarize(results, parent.run_id)
        summary["bill"] = pipeline_bill(config, results, seconds)
        summary["mlflow_url"] = ui_link(parent.uri, parent.experiment_id, parent.run_id)
        parent.log_metrics(bill.metrics(summary["bill"], bill.PIPELINE_METRICS), step=0)
        metrics = {"final_val_loss": summary["final_val_loss"]}
        metrics.update({f"hellaswag/{k}": v for k, v in (summary["hellaswag"] or {}).items()
                        if isinstance(v, (int, float))})
        if summary["core"]:
            metrics["core/score"] = summary["core"]["score"]
        parent.log_metrics({k: v for k, v in metrics.items() if v is not None}, step=0)
        parent.log_dict(summary, "pipeline.json")
        report_runs(parent, config, results["train"].get("mlflow_run_id"), logger)
    # What `gpt2 run` prints, for a run started from a deployment too: in the log and as an artifact.
    text = where_things_are(config, summary)
    logger.info("%s", text, extra={SUMMARY_RECORD: True})
    create_markdown_artifact(f"```\n{text}\n```", key="pipeline-summary",
                             description="What this pipeline run did: checkpoint, exports, MLflow, bill")
    publish_result(config, summary)  # for a sweep that started this run as a deployment (flows.sweep)
    return summary


def main() -> None:
    flow_main(pipeline_flow, __doc__)


if __name__ == "__main__":
    main()
