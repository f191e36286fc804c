"""The Prefect side of `gpt2 stack`: profile, work pools, automations, deploy.

Every function takes the API URL of the stack's server explicitly, so nothing
here depends on which profile is active when it runs.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from flows import deployment_file

PROFILE = "gpt2-local"
# Work pool name -> base job template the local stack creates it with.
LOCAL_POOLS = {"cpu": "process-cpu", "gpu": "process-gpu"}
# One local accelerator: one run on it at a time. The cpu pool runs the parent
# next to its stages, so it has no limit.
POOL_CONCURRENCY = {"gpu": 1}


@contextmanager
def client(api_url: str) -> Iterator[Any]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        with get_client(sync_client=True) as c:
            yield c


def use_profile(api_url: str) -> str:
    """Make `gpt2-local` (PREFECT_API_URL = the stack) the active profile;
    returns the profile that was active before."""
    from prefect.settings import PREFECT_API_URL
    from prefect.settings.profiles import Profile, load_profiles, save_profiles

    profiles = load_profiles()
    previous = profiles.active_name
    profiles.add_profile(Profile(name=PROFILE, settings={PREFECT_API_URL: api_url}))
    profiles.set_active(PROFILE)
    save_profiles(profiles)
    return previous


def restore_profile(previous: str | None) -> None:
    """Drop our profile; if it was active, switch back to `previous` (the
    default profile if that one is gone). A profile the user chose since stays."""
    from prefect.settings.profiles import load_profiles, save_profiles

    profiles = load_profiles()
    if PROFILE not in profiles.names:
        return
    if profiles.active_name == PROFILE:
        profiles.set_active(previous if previous in profiles.names and previous != PROFILE else "ephemeral")
    profiles.remove_profile(PROFILE)
    save_profiles(profiles)


def active_profile() -> str | None:
    from prefect.settings.profiles import load_profiles

    return load_profiles().active_name


def create_pools(api_url: str) -> None:
    """The local `cpu` and `gpu` process pools with our base job templates (replaced if present)."""
    from prefect.client.schemas.actions import WorkPoolCreate

    with client(api_url) as c:
        for pool, template in LOCAL_POOLS.items():
            spec = WorkPoolCreate(name=pool, type="process", base_job_template=deployment_file.pool_template(template),
                                  description=f"Local process pool `{pool}` (gpt2 stack)",
                                  concurrency_limit=POOL_CONCURRENCY.get(pool))
            c.create_work_pool(spec, overwrite=True)


def apply_automations(api_url: str, max_reschedules: int) -> list[str]:
    """Create every automation, replacing ones of the same name; returns their names."""
    from prefect.events.schemas.automations import AutomationCore

    names = []
    with client(api_url) as c:
        for spec in deployment_file.automations(max_reschedules):
            for old in c.read_automations_by_name(spec["name"]):
                c.delete_automation(old.id)
            c.create_automation(AutomationCore.model_validate(spec))
            names.append(spec["name"])
    return names


def deploy_all(api_url: str, env: dict[str, str], log_path: str) -> None:
    """`prefect deploy --all` from the project directory against the stack's server."""
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"]
    with open(log_path, "ab") as log:
        done = subprocess.run(cmd, cwd=deployment_file.PROJECT_DIR, env={**env, "PREFECT_API_URL": api_url},
                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"`prefect deploy --all` failed (exit {done.returncode}); see {log_path}")


def pool_status(api_url: str) -> dict[str, str | None]:
    """Each local pool's status (READY once a worker polls it), None if missing."""
    from prefect.exceptions import ObjectNotFound

    out: dict[str, str | None] = {}
    with client(api_url) as c:
        for pool in LOCAL_POOLS:
            try:
                status = c.read_work_pool(pool).status
                out[pool] = status.value if status else None
            except ObjectNotFound:
                out[pool] = None
    return out
