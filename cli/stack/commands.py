"""`gpt2 stack up|down|status`: the whole architecture on this machine: a real
Prefect server, an MLflow server, and one process worker per work pool.

    gpt2 stack up                              # then, in the same shell:
    prefect deployment run gpt2/full-pipeline
    gpt2 stack status --json                   # exit 1 unless every part is healthy
    gpt2 stack down
    gpt2 stack automations --max-reschedules 5   # (re)apply the automations to any server, idempotently

`up` switches the Prefect profile to `gpt2-local` so that `prefect` commands
talk to this server with its auth string (a PREFECT_API_URL or
PREFECT_API_AUTH_STRING set in the environment still wins); `down` switches
back to the profile that was active before. The UI asks for the auth string,
which lives in the stack directory's `prefect-auth` file.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Optional

import typer

from cli.common import JsonOpt, emit, fail
from flows.deployment_file import (
    DEFAULT_MAX_RESCHEDULES,
    DEFAULT_RESCHEDULE_AFTER_S,
    DEFAULT_ZOMBIE_AFTER_S,
    MIN_PROACTIVE_S,
    MIN_ZOMBIE_AFTER_S,
)

app = typer.Typer(help="A local Prefect server, MLflow server and workers (the cloud architecture, on loopback).",
                  no_args_is_help=True)

StateDirOpt = typer.Option(None, "--state-dir", help="Where state, logs and databases live "
                           "(default $GPT2_STACK_DIR or ~/.cache/gpt2-pipeline/stack).")
RootOpt = typer.Option(None, "--root", help="Artifact root whose MLflow store the server shows (default: the "
                       "project's ./artifacts, where deployment runs write unless they set runtime.root).")
ReschedulesOpt = typer.Option(DEFAULT_MAX_RESCHEDULES, "--max-reschedules", min=0,
                              help="How many times a crashed (preempted) GPU run is rescheduled; 0: never.")
ZombieOpt = typer.Option(DEFAULT_ZOMBIE_AFTER_S, "--zombie-after", min=MIN_ZOMBIE_AFTER_S,
                         help="Seconds without a heartbeat after which a GPU run (or the pipeline's parent) is "
                              "marked Crashed and rescheduled. Raise it where networks are flaky: a false alarm "
                              "reschedules a run that is still training (its lease keeps the two apart).")
RescheduleAfterOpt = typer.Option(DEFAULT_RESCHEDULE_AFTER_S, "--reschedule-after", min=MIN_PROACTIVE_S,
                                  help="Seconds a crashed GPU run stays Crashed before it is rescheduled: past a "
                                       "process worker's second report of the same crash.")


def _state_dir(path: Optional[Path]) -> Path:
    from cli.stack.services import default_state_dir

    return (path or default_state_dir()).expanduser().resolve()


def _say(message: str) -> None:
    typer.echo(message, err=True)  # progress on stderr keeps stdout for --json


def _warn_shell_overrides(api_url: str, auth: str | None) -> None:
    for name, value in (("PREFECT_API_URL", api_url), ("PREFECT_API_AUTH_STRING", auth)):
        if os.environ.get(name) not in (None, value):
            _say(f"note: {name} is set in this shell and wins over the profile; unset it to reach the stack")


LINK_LOOKUP_S = 15.0
"""How long `up` waits for MLflow to name the experiment before printing the bare address
(MLflow's own clients retry for minutes)."""


def _runs_page(mlflow_url: str, root: str) -> str:
    """The experiment's runs table on the stack's MLflow (the experiment is made
    now if new, as the stages would make it), so a fresh browser opens on the
    training runs rather than MLflow's GenAI view; the bare URL if that fails."""
    from gpt2.config.runtime import RuntimeConfig
    from gpt2.config.tree import Config
    from gpt2.root import layout
    from gpt2.tracking.experiment import ensure_experiment, ui_link

    config = Config(runtime=RuntimeConfig(root=root))
    found: dict = {}

    def look_up() -> None:
        try:
            from mlflow import MlflowClient

            found["id"] = ensure_experiment(MlflowClient(tracking_uri=mlflow_url), config.tracking.experiment,
                                            layout.mlflow_artifacts(config))
        except Exception as err:  # noqa: BLE001 - only the link is at stake
            found["error"] = err

    worker = threading.Thread(target=look_up, daemon=True)
    worker.start()
    worker.join(LINK_LOOKUP_S)
    if "id" not in found:
        _say(f"note: could not look up the MLflow experiment ({found.get('error', 'no answer')}); "
             "open the runs from its home page")
        return mlflow_url
    return ui_link(mlflow_url, found["id"])


GpuPoolsOpt = typer.Option(None, "--gpu-pools", help="The ladder of GPU pools to stand up, comma-separated (e.g. "
                           "gpu-spot,gpu): one local process pool per rung, with its deployments from prefect.yaml. "
                           "The `gpu` pool is always there.")
NoWorkerOpt = typer.Option(None, "--no-worker", help="Pools to leave without a worker (comma-separated, or repeated): "
                           "a rung with no capacity, so a run there waits and the ladder moves on.")


def _names(values: Optional[list[str]]) -> list[str]:
    return [name.strip() for value in values or [] for name in value.split(",") if name.strip()]


def up(state_dir: Optional[Path] = StateDirOpt, root: Optional[str] = RootOpt, max_reschedules: int = ReschedulesOpt,
       zombie_after_s: int = ZombieOpt, gpu_pools: Optional[str] = GpuPoolsOpt,
       no_worker: Optional[list[str]] = NoWorkerOpt, reschedule_after_s: int = RescheduleAfterOpt,
       as_json: bool = JsonOpt) -> None:
    """Start the stack (or report the running one) and deploy prefect.yaml to it."""
    from cli.stack import services
    from cli.stack.prefect_setup import LadderPoolsError, stack_pools
    from cli.stack.processes import ServiceError

    try:
        pools = stack_pools(_names([gpu_pools] if gpu_pools else []), _names(no_worker))
    except LadderPoolsError as err:
        fail(str(err))
    try:
        state = services.up(_state_dir(state_dir), root, max_reschedules, say=_say, zombie_after_s=zombie_after_s,
                            pools=pools, reschedule_after_s=reschedule_after_s)
    except (ServiceError, RuntimeError) as err:
        fail(str(err))
    result = services.status(_state_dir(state_dir)) | {"already_up": bool(state.get("already_up"))}
    result["mlflow_runs_url"] = _runs_page(result["mlflow_url"], result["root"]) if result["mlflow_url"] else None
    _warn_shell_overrides(result["prefect_api_url"], services.read_auth(_state_dir(state_dir)))
    emit(result, as_json, "\n".join([
        f"Prefect UI:  {result['prefect_ui_url']}   (profile {result['profile']} is now active)",
        f"login:       the auth string in {result['prefect_auth_file']}",
        f"MLflow UI:   {result['mlflow_runs_url']}",
        f"artifacts:   {result['root']}",
        f"work pools:  {services.describe_pools(result['pools'])}",
        f"logs:        {Path(result['state_dir']) / 'logs'}",
        "next:        prefect deployment run gpt2/full-pipeline" + _ladder_hint(result["pools"]),
    ]))


def _ladder_hint(pools: dict[str, bool]) -> str:
    """With rungs beyond `gpu`, how to run a pipeline down them (cheapest first, as listed)."""
    rungs = [pool for pool in pools if pool != "cpu"]
    if rungs == ["gpu"]:
        return ""
    ladder = ",".join(rungs)
    return f" --param overrides='{{\"runtime.gpu_pools\": \"{ladder}\"}}'"


def down(state_dir: Optional[Path] = StateDirOpt, as_json: bool = JsonOpt) -> None:
    """Stop what `up` started and restore the previous Prefect profile."""
    from cli.stack import services

    result = services.down(_state_dir(state_dir))
    stopped = ", ".join(result["stopped"]) or "nothing was running"
    killed = "".join(f"\nkilled after {result['seconds'][name]:.0f} s (outlived their SIGTERM window) under {name}: "
                     + "; ".join(left) for name, left in result.get("killed", {}).items())
    emit(result, as_json, f"stopped: {stopped}" + killed
         + (f"\nprofile: {result['profile']}" if "profile" in result else ""))


def status(state_dir: Optional[Path] = StateDirOpt, as_json: bool = JsonOpt) -> None:
    """Health of the server, MLflow, each worker and the rescheduler; exit 1 unless all are healthy."""
    from cli.stack import services

    result = services.status(_state_dir(state_dir))
    mlflow_up = result["parts"].get("mlflow", {}).get("healthy")
    # The runs table, as `up` prints it: the bare address opens MLflow's GenAI view in a fresh browser.
    result["mlflow_runs_url"] = _runs_page(result["mlflow_url"], result["root"]) if mlflow_up else None
    lines = [f"{'healthy' if result['healthy'] else 'NOT healthy' if result['up'] else 'not up'}",
             f"Prefect API: {result['prefect_api_url']}",
             f"MLflow UI:   {result['mlflow_runs_url'] or result['mlflow_url']}",
             f"artifacts:   {result['root']}"]
    lines += [f"auth string: {result['prefect_auth_file']}"] if result["up"] else []
    lines += [f"{name:12} {'ok' if p['alive'] and p.get('healthy', True) else 'DOWN'} (pid {p['pid']}, log {p['log']})"
              for name, p in result["parts"].items()]
    emit(result, as_json, "\n".join(lines))
    if not result["healthy"]:
        raise typer.Exit(1)


def automations(max_reschedules: int = ReschedulesOpt, zombie_after_s: int = ZombieOpt,
                reschedule_after_s: int = RescheduleAfterOpt, as_json: bool = JsonOpt) -> None:
    """Apply deployments/automations/ to the Prefect server of the active profile
    (a cluster's, or the stack's), replacing automations of the same names: safe
    to run again, unlike `prefect automation create`."""
    from prefect.client.orchestration import get_client

    from cli.stack.prefect_setup import replace_automations

    try:
        with get_client(sync_client=True) as c:
            names = replace_automations(c, max_reschedules, zombie_after_s, reschedule_after_s)
            url = str(c.api_url)
    except Exception as err:  # noqa: BLE001 - an unreachable or refusing server, said plainly
        fail(f"could not apply the automations: {err}")
    emit({"automations": names, "prefect_api_url": url}, as_json, f"applied to {url}: {', '.join(names)}")


app.command("up")(up)
app.command("automations")(automations)
app.command("down")(down)
app.command("status")(status)
