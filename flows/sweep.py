"""The sweep flow (deployment `gpt2/sweep`): many training runs from one preset, the data
stage once per data config, each member an ordinary pipeline run (its own run address, so a
member equal to an existing run, or finished before a crash, is answered from its cache), one
member's failure not the others', compared at the end in one table and one figure.

    gpt2 sweep --preset smoke --grid train.lr=1e-3,3e-3                 # in this process
    prefect deployment run gpt2/sweep -p preset=smoke \\
        -p grid='{"train.lr": [0.001, 0.003]}'                          # on the work pools

Run from a deployment, each member is a `gpt2/full-pipeline` run (each stage on its pool, the
GPU ladder as any run has it), at most runtime.max_parallel_runs, or the train deployment's
concurrency limit if lower, in flight at once; started with an idempotency key per member, so
a restarted sweep re-attaches to the members it started. Run locally, members run one after
another in this process (one machine has one device to train on).

MLflow: a parent run for the sweep, each member's pipeline run its child (with its stage runs
inside), the members' settings as their params; the sweep's table as `sweep.json` and its
figure (the members' training runs, gpt2.report) as `report.png` on the parent.
"""

from __future__ import annotations

import contextvars
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import deployment, flow_run

from flows.entry import flow_main
from flows.pipeline import parent_tracker
from flows.stages import DEPLOYMENTS, publish_result
from flows.summary import SUMMARY_RECORD
from gpt2.config.overrides import resolve_config
from gpt2.process import signals
from gpt2.secrets import redact
from gpt2.sweep.groups import DataGroup, data_groups
from gpt2.sweep.members import Member, check_runs, member_sets, resolve_members
from gpt2.sweep.table import describe, mark_best, member_bill, member_row, sweep_bill
from gpt2.tracking.experiment import children_link, ui_link
from gpt2.tracking.tracker import Tracker
from gpt2.train import bill as bills
from tasks.tracking import run_under

PIPELINE_DEPLOYMENT = "gpt2/full-pipeline"
TRAIN_DEPLOYMENT = DEPLOYMENTS["train"]


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return redact(f"{type(err).__name__}: {text[0] if text else ''}")


def run_data(group: DataGroup, preset: str, overrides: dict[str, Any], parent_run_id: str | None) -> dict[str, Any]:
    """The group's data stage, once, before its members (which then find it cached)."""
    params = {"preset": preset, "overrides": {**overrides, **group.members[0].overrides}}
    if deployment.id:
        from flows.stages import run_stage_deployment, stage_overrides

        params["overrides"] = stage_overrides(group.config, params["overrides"])
        return run_stage_deployment("data", group.config, {**params, "parent_run_id": parent_run_id},
                                    parent_key=f"{flow_run.id}:data-{group.fingerprint}")
    from flows.data import data_flow

    return data_flow(**params, parent_run_id=parent_run_id)


def run_member_here(member: Member, preset: str, overrides: dict[str, Any], parent_run_id: str | None) -> dict:
    from flows.pipeline import pipeline_flow

    return pipeline_flow(preset, {**overrides, **member.overrides}, parent_run_id=parent_run_id)


def run_member_deployed(member: Member, preset: str, overrides: dict[str, Any], parent_run_id: str | None) -> dict:
    """The member as a `gpt2/full-pipeline` run, keyed by the sweep's flow run and the member's
    run, so a restarted sweep re-attaches to it instead of starting it twice."""
    from prefect.deployments import run_deployment

    from flows.stages import completed_result, stage_overrides

    params = {"preset": preset, "overrides": stage_overrides(member.config, {**overrides, **member.overrides}),
              "parent_run_id": parent_run_id}
    child = run_deployment(PIPELINE_DEPLOYMENT, parameters=params, timeout=0, as_subflow=True,
                           idempotency_key=f"{flow_run.id}:member-{member.run_name}")
    get_run_logger().info("member %d (%s): flow run %s", member.index, member.label, child.name)
    return completed_result("pipeline", member.config, child, f"pipeline run {child.name}")


def train_deployment(config) -> str:
    """Where members start training: the train deployment, or its first rung's on a ladder of GPU pools."""
    from gpt2.ladder import rungs

    return rungs.deployment("train", config.runtime.gpu_pools[0].pool) if config.runtime.gpu_pools else TRAIN_DEPLOYMENT


def parallelism(members: list[Member]) -> int:
    """runtime.max_parallel_runs, or the slots of the deployment members start training on and
    of its work pool where fewer (a member beyond them would only wait for a slot). 1 in this process."""
    if not deployment.id:
        return 1
    limits = [members[0].config.runtime.max_parallel_runs]
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        train = client.read_deployment_by_name(train_deployment(members[0].config))
        limits += [train.concurrency_limit, client.read_work_pool(train.work_pool_name).concurrency_limit]
    return max(1, min(n for n in limits if n))


def run_members(members: list[Member], failed_data: dict[int, str], parallel: int,
                run_one: Callable[[Member], dict]) -> list[tuple[dict | None, str | None]]:
    """Every member's (result, error): at most `parallel` at once; one's failure is its own."""
    def attempt(member: Member) -> tuple[dict | None, str | None]:
        if member.index in failed_data:
            return None, failed_data[member.index]
        signals.stop_if_requested()
        try:
            return run_one(member), None
        except Exception as err:  # noqa: BLE001 - a member's failure is its row's, never the sweep's
            get_run_logger().error("member %d (%s) failed: %s", member.index, member.label, _one_line(err))
            return None, _one_line(err)

    if parallel <= 1:
        return [attempt(m) for m in members]
    with ThreadPoolExecutor(max_workers=parallel) as pool:  # each thread in a copy of this flow run's context
        futures = [pool.submit(contextvars.copy_context().run, attempt, m) for m in members]
        return [f.result() for f in futures]


def report_members(parent: Tracker, experiment: str, rows: list[dict]) -> None:
    """`report.png` on the sweep's run: the members' training runs on one figure. A figure
    is a convenience: failing to draw it costs a warning, never the sweep."""
    runs = [r["train_mlflow_run_id"] for r in rows if r["train_mlflow_run_id"]]
    if not parent.enabled or not runs:
        return
    try:
        from tasks.runs_report import make_report

        with tempfile.TemporaryDirectory() as tmp:
            report = make_report(parent.uri, experiment, runs, Path(tmp) / "report.png")
            parent.log_artifact(Path(report["path"]))
    except Exception as err:  # noqa: BLE001 - see the docstring
        get_run_logger().warning("sweep report not drawn: %s", _one_line(err))


def run_data_groups(groups: list[DataGroup], preset: str, overrides: dict[str, Any],
                    parent: Tracker) -> tuple[list[dict], dict[int, str]]:
    """Each group's data stage, once: what each did, and the members whose data failed (with why)."""
    data, failed = [], {}
    for group in groups:
        entry = {"manifest": group.manifest, "members": [m.index for m in group.members]}
        try:
            result = run_under(parent, lambda under: run_data(group, preset, overrides, under))
            entry["cached"] = bool(result.get("cached"))
        except Exception as err:  # noqa: BLE001 - its members fail, the other groups' go on
            entry["error"] = _one_line(err)
            failed.update({m.index: f"data stage: {entry['error']}" for m in group.members})
        data.append(entry)
    return data, failed


def track_outcome(parent: Tracker, rows: list[dict]) -> dict[str, Any]:
    """The best member marked, the bill added up, both on the sweep's run; the summary without `data`."""
    best, total = mark_best(rows), sweep_bill(rows)
    if best is not None:
        parent.log_metrics({"best/final_val_loss": best["final_val_loss"], "best/member": best["member"]}, step=0)
    parent.log_metrics(bills.metrics(total, ("device_hours", "cost")), step=0)
    linked = parent.enabled
    return {"members": rows, "best": best["member"] if best else None, "bill": total,
            "failed": [r["member"] for r in rows if r["state"] == "failed"], "mlflow_run_id": parent.run_id,
            "mlflow_url": ui_link(parent.uri, parent.experiment_id, parent.run_id) if linked else None,
            "mlflow_members_url": children_link(parent.uri, parent.experiment_id, parent.run_id) if linked else None}


# Named `gpt2` as the pipeline is: its deployment is `gpt2/sweep` beside `gpt2/full-pipeline`.
@flow(name="gpt2", log_prints=False)
def sweep_flow(preset: str = "smoke", overrides: dict[str, Any] | None = None,
               grid: dict[str, list[Any]] | None = None, members: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every member of `grid` (key -> values, their Cartesian product) and `members` (a list of
    override sets), each beside the common `overrides`; neither: the preset as one member."""
    overrides = dict(overrides or {})
    sets = member_sets(grid or {}, check_runs(members, "the members parameter") if members else None)
    crew = resolve_members(preset, overrides, sets)
    config = resolve_config(preset, overrides)
    logger = get_run_logger()
    groups = data_groups(crew)
    logger.info("sweep of %d member(s) on %d data config(s)", len(crew), len(groups))
    with parent_tracker(config, preset, kind="sweep") as parent:
        parent.log_params({"sweep.members": len(crew), "sweep.keys": sorted({k for s in sets for k in s}),
                           **{f"sweep.member_{m.index}": m.label for m in crew}})
        data, failed_data = run_data_groups(groups, preset, overrides, parent)
        run_one = run_member_deployed if deployment.id else run_member_here
        outcomes = run_members(crew, failed_data, parallelism(crew),
                               lambda m: run_under(parent, lambda under: run_one(m, preset, overrides, under)))
        rows = [member_row(m, result, error, member_bill(m)) for m, (result, error) in zip(crew, outcomes)]
        summary = track_outcome(parent, rows)
        summary["data"] = data
        parent.log_dict(summary, "sweep.json")
        report_members(parent, config.tracking.experiment, rows)
    publish_result(config, summary)  # for whoever started the sweep as a deployment
    text = describe(rows, summary["bill"])
    logger.info("sweep finished:\n%s", text, extra={SUMMARY_RECORD: True})  # `gpt2 sweep` prints it itself
    create_markdown_artifact(f"```\n{text}\n```", key="sweep-summary", description="Every member of this sweep")
    return summary


def main() -> None:
    flow_main(sweep_flow, __doc__)


if __name__ == "__main__":
    main()
