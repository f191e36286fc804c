"""The Prefect side of `gpt2 stack`: profile, work pools, automations, deploy.

Every function takes the API URL and the auth string of the stack's server
explicitly, so nothing here depends on which profile is active when it runs.
"""

from __future__ import annotations

import os
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


def client_env(api_url: str, auth: str | None) -> dict[str, str]:
    """The Prefect settings a client of the stack's server needs, as environment
    variables: its URL, its auth string (without it every request but /health
    gets 401) and CSRF token handling (on by default; the server demands it)."""
    env = {"PREFECT_API_URL": api_url, "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "true"}
    return env | ({"PREFECT_API_AUTH_STRING": auth} if auth else {})


def _settings(api_url: str, auth: str | None) -> dict[Any, Any]:
    import prefect.settings

    return {getattr(prefect.settings, name): value for name, value in client_env(api_url, auth).items()}


@contextmanager
def client(api_url: str, auth: str | None) -> Iterator[Any]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings

    # None overrides too: an auth string of this process's own profile belongs to another server.
    with temporary_settings(updates={PREFECT_API_AUTH_STRING: None, **_settings(api_url, auth)}):
        with get_client(sync_client=True) as c:
            yield c


def use_profile(api_url: str, auth: str) -> str:
    """Make `gpt2-local` (the stack's URL and auth string) the active profile;
    returns the profile that was active before."""
    from prefect.settings import get_current_settings
    from prefect.settings.profiles import Profile, load_profiles, save_profiles

    profiles = load_profiles()
    previous = profiles.active_name
    profiles.add_profile(Profile(name=PROFILE, settings=_settings(api_url, auth)))
    profiles.set_active(PROFILE)
    save_profiles(profiles)
    _owner_only(get_current_settings().profiles_path)  # it holds the auth string now
    return previous


def _owner_only(path: os.PathLike) -> None:
    # Prefect creates the file 0600, but one the user wrote first may be readable by others.
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o600)


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


def create_pools(api_url: str, auth: str) -> None:
    """The local `cpu` and `gpu` process pools with our base job templates (replaced if present)."""
    from prefect.client.schemas.actions import WorkPoolCreate

    with client(api_url, auth) as c:
        for pool, template in LOCAL_POOLS.items():
            spec = WorkPoolCreate(name=pool, type="process", base_job_template=deployment_file.pool_template(template),
                                  description=f"Local process pool `{pool}` (gpt2 stack)",
                                  concurrency_limit=POOL_CONCURRENCY.get(pool))
            c.create_work_pool(spec, overwrite=True)


def apply_automations(api_url: str, auth: str, max_reschedules: int,
                      zombie_after_s: int = deployment_file.DEFAULT_ZOMBIE_AFTER_S) -> list[str]:
    """Create every automation on the stack's server, replacing ones of the same name; returns their names."""
    with client(api_url, auth) as c:
        return replace_automations(c, max_reschedules, zombie_after_s)


def replace_automations(c, max_reschedules: int, zombie_after_s: int) -> list[str]:
    """Through Prefect client `c`: every automation of deployments/automations/,
    each replacing those of its name, so applying twice leaves one of each
    (`prefect automation create` would add a second); returns their names."""
    from prefect.events.schemas.automations import AutomationCore

    names = []
    for spec in deployment_file.automations(max_reschedules, zombie_after_s):
        for old in c.read_automations_by_name(spec["name"]):
            c.delete_automation(old.id)
        c.create_automation(AutomationCore.model_validate(spec))
        names.append(spec["name"])
    return names


def deploy_all(api_url: str, auth: str, env: dict[str, str], log_path: str) -> None:
    """`prefect deploy --all` from the project directory against the stack's server."""
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"]
    with open(log_path, "ab") as log:
        done = subprocess.run(cmd, cwd=deployment_file.PROJECT_DIR, env={**env, **client_env(api_url, auth)},
                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"`prefect deploy --all` failed (exit {done.returncode}); see {log_path}")


def pool_status(api_url: str, auth: str | None) -> dict[str, str | None]:
    """Each local pool's status (READY once a worker polls it), None if missing."""
    from prefect.exceptions import ObjectNotFound

    out: dict[str, str | None] = {}
    with client(api_url, auth) as c:
        for pool in LOCAL_POOLS:
            try:
                status = c.read_work_pool(pool).status
                out[pool] = status.value if status else None
            except ObjectNotFound:
                out[pool] = None
    return out
