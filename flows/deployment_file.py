"""What `prefect.yaml` and `deployments/` hold, loaded for the local stack (cli/stack) and the tests.

    pool_template("process-gpu")          # a base job template (dict)
    automations(max_reschedules=5)        # the automations, with the reschedule cap applied
    deployments()                         # prefect.yaml's deployments, anchors resolved

The files are the source of truth (users apply them with `prefect` commands
too); this module only reads them and applies the reschedule cap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEPLOYMENTS_DIR = PROJECT_DIR / "deployments"
PREFECT_YAML = PROJECT_DIR / "prefect.yaml"

# The flow-run heartbeat period (s) on GPU pools; PREFECT_RUNNER_HEARTBEAT_FREQUENCY
# is its legacy name. deployments/automations/zombie-runs.yaml assumes 30.
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
GPU_HEARTBEAT_S = 30
# The pull step in prefect.yaml moves each flow run into this directory.
PROJECT_DIR_ENV = "GPT2_PROJECT_DIR"
RESCHEDULE_AUTOMATION = "gpt2-reschedule-preempted"
RESCHEDULE_CAP_AUTOMATION = "gpt2-reschedule-cap"
DEFAULT_MAX_RESCHEDULES = 3
ZOMBIE_AUTOMATION = "gpt2-zombie-runs"
DEFAULT_ZOMBIE_AFTER_S = 90
MIN_ZOMBIE_AFTER_S = 60
"""Two missed 30 s heartbeats: a shorter window calls a run alive but slow to report a zombie."""
DEFAULT_RESCHEDULE_AFTER_S = 20
"""How long a crashed run stays Crashed before the reschedule automation puts it back: past the
process worker's second report of the same crash (reschedule-preempted.yaml says why; the local
stack's workers make none where the first landed, cli.stack.worker)."""
MIN_PROACTIVE_S = 10
"""Prefect's floor for a proactive trigger's `within`: a shorter wait is refused by its models."""


def pool_template(name: str) -> dict[str, Any]:
    return json.loads((DEPLOYMENTS_DIR / "pools" / f"{name}.json").read_text())


def _automation_files() -> list[Path]:
    return sorted((DEPLOYMENTS_DIR / "automations").glob("*.yaml"))


def run_counts(max_reschedules: int) -> list[str]:
    """The `prefect.run-count` values whose crash is rescheduled: 1..N."""
    if max_reschedules < 0:
        raise ValueError("max_reschedules must be >= 0")
    return [str(n) for n in range(1, max_reschedules + 1)]


def run_counts_beyond(max_reschedules: int) -> list[str]:
    """Glob patterns (fnmatch, as the server matches event labels) for the
    decimal run counts above `max_reschedules`; up to 98."""
    if not 0 <= max_reschedules <= 98:
        raise ValueError(f"max_reschedules must be within 0..98, got {max_reschedules}")
    first = max_reschedules + 1
    if first <= 9:
        return [f"[{first}-9]", "[1-9][0-9]*"]
    tens, units = divmod(first, 10)
    patterns = [f"{tens}[{units}-9]"] + ([f"[{tens + 1}-9][0-9]"] if tens < 9 else [])
    return patterns + ["[1-9][0-9][0-9]*"]


def automations(max_reschedules: int = DEFAULT_MAX_RESCHEDULES,
                zombie_after_s: int = DEFAULT_ZOMBIE_AFTER_S,
                reschedule_after_s: int = DEFAULT_RESCHEDULE_AFTER_S) -> list[dict[str, Any]]:
    """Every automation under deployments/automations/, the reschedule one capped at
    `max_reschedules` (0 disables it: no run count matches), waiting `reschedule_after_s`
    after a crash, and the cap on the AwaitingRetry path cancelling a run put back beyond
    it, the zombie one marking a watched run Crashed after `zombie_after_s` without a heartbeat."""
    if zombie_after_s < MIN_ZOMBIE_AFTER_S:
        raise ValueError(f"the zombie window must be at least {MIN_ZOMBIE_AFTER_S} s (two missed 30 s heartbeats); "
                         f"got {zombie_after_s}")
    if reschedule_after_s < MIN_PROACTIVE_S:
        raise ValueError(f"the reschedule wait must be at least {MIN_PROACTIVE_S} s (Prefect's floor for a "
                         f"proactive trigger); got {reschedule_after_s}")
    found = []
    for path in _automation_files():
        spec = yaml.safe_load(path.read_text())
        if spec["name"] == RESCHEDULE_AUTOMATION:
            counts = run_counts(max_reschedules)
            spec["trigger"]["match"]["prefect.run-count"] = counts
            spec["enabled"] = bool(counts)
            spec["trigger"]["within"] = reschedule_after_s
        if spec["name"] == RESCHEDULE_CAP_AUTOMATION:
            spec["trigger"]["match"]["prefect.run-count"] = run_counts_beyond(max_reschedules)
        if spec["name"] == ZOMBIE_AUTOMATION:
            default = spec["trigger"]["within"]
            spec["trigger"]["within"] = zombie_after_s
            for holder in (spec, spec["actions"][0]):
                key = "description" if holder is spec else "message"
                holder[key] = holder[key].replace(f"{default} s", f"{zombie_after_s} s")
        found.append(spec)
    return found


def deployments() -> list[dict[str, Any]]:
    """prefect.yaml's deployments with YAML anchors and merge keys resolved."""
    return yaml.safe_load(PREFECT_YAML.read_text())["deployments"]


def pull_steps() -> list[dict[str, Any]]:
    return yaml.safe_load(PREFECT_YAML.read_text())["pull"]


def missing_rungs(pools: list[str]) -> list[str]:
    """The deployments a ladder of GPU pools (runtime.gpu_pools) needs that
    prefect.yaml lacks: every GPU stage's (gpt2.ladder.rungs.deployment) on each
    rung's pool, each a copy of the `gpu` pool's deployment but for its pool."""
    from gpt2.ladder import rungs

    found = {spec["name"]: spec for spec in deployments()}
    missing = []
    for pool in pools:
        for stage in rungs.FLOWS:
            name = rungs.deployment(stage, pool).split("/", 1)[1]
            spec = found.get(name)
            if spec is None or spec["work_pool"]["name"] != pool:
                missing.append(f"{name} (on work pool {pool})")
    return missing
