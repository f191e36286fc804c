"""The Prefect side of `gpt2 stack`: profile, work pools, automations, deploy.

Every function takes the API URL and the auth string of the stack's server
explicitly, so nothing here depends on which profile is active when it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from flows import deployment_file

PROFILE = "gpt2-local"
# Work pool name -> base job template the local stack creates it with; every
# other pool it stands up (a rung of the ladder of GPU pools) is a GPU pool.
LOCAL_POOLS = {"cpu": "process-cpu", "gpu": "process-gpu"}
GPU_TEMPLATE = "process-gpu"
# One local accelerator: one run on each GPU pool at a time. The cpu pool runs
# the parent next to its stages, so it has no limit.
CPU_POOL = "cpu"


class LadderPoolsError(ValueError):
    """`gpt2 stack up --gpu-pools/--no-worker` names a pool it cannot stand up."""


def stack_pools(gpu_pools: list[str], no_worker: list[str]) -> dict[str, bool]:
    """The pools the stack stands up, each with whether a worker polls it: `cpu`
    and `gpu` as always, plus each GPU pool of the ladder (`--gpu-pools`; each
    must have its deployments in prefect.yaml), without a worker where asked
    (`--no-worker`: a rung with no capacity)."""
    deployed = {spec["work_pool"]["name"] for spec in deployment_file.deployments()}
    problems = [f"--gpu-pools {p}: prefect.yaml has no deployments on work pool {p!r} (it has: "
                f"{', '.join(sorted(deployed - {CPU_POOL}))}); add its train-{p} and evaluate-{p}"
                for p in gpu_pools if p not in deployed]
    problems += [f"--gpu-pools {CPU_POOL}: the cpu pool is not a GPU pool" for p in gpu_pools if p == CPU_POOL]
    pools = {CPU_POOL: True, **{p: True for p in gpu_pools}, "gpu": True}  # the ladder's order, cheapest first
    problems += [f"--no-worker {p}: not a pool of this stack ({', '.join(pools)})" for p in no_worker if p not in pools]
    problems += [f"--no-worker {CPU_POOL}: the parent and the data stage run there" for p in no_worker if p == CPU_POOL]
    if problems:
        raise LadderPoolsError("; ".join(problems))
    return {p: p not in no_worker for p in pools}


def stack_deployments(pools: dict[str, bool]) -> list[str]:
    """prefect.yaml's deployments on the stack's pools (the ladder's other rungs are left out)."""
    return [spec["name"] for spec in deployment_file.deployments() if spec["work_pool"]["name"] in pools]


def isolated_env(home: Path) -> dict[str, str]:
    """This process's environment for a stack apart from the user's own (the
    tests', the fault soak's): nothing that points Prefect or MLflow elsewhere,
    a HOME of its own (so its own Prefect profile), one intra-op thread.

    One thread per trainer because a stack's processes share the machine's
    cores: two OpenMP threads per trainer spin against each other and
    everything else (a smoke step ran 20x slower that way); a user's own
    OMP_NUM_THREADS is kept. The cache stays this user's: with a fresh HOME
    each stack would otherwise copy the migrated empty databases new stacks
    start from (gpt2.tracking.store) again, which a user's machine does once."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k not in ("GPT2_STACK_DIR", "MLFLOW_TRACKING_URI")}
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": cache, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


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
def server_settings(api_url: str, auth: str | None) -> Iterator[None]:
    """This thread's Prefect settings those of the stack's server (and of a thread that copies its context)."""
    from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings

    # None overrides too: an auth string of this process's own profile belongs to another server.
    with temporary_settings(updates={PREFECT_API_AUTH_STRING: None, **_settings(api_url, auth)}):
        yield


@contextmanager
def client(api_url: str, auth: str | None) -> Iterator[Any]:
    from prefect.client.orchestration import get_client

    with server_settings(api_url, auth), get_client(sync_client=True) as c:
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


def create_pools(api_url: str, auth: str, pools: Iterable[str] = tuple(LOCAL_POOLS)) -> None:
    """The local process pools (`cpu`, `gpu`, the ladder's rungs) with our base job templates (replaced if present)."""
    from prefect.client.schemas.actions import WorkPoolCreate

    with client(api_url, auth) as c:
        for pool in pools:
            template = LOCAL_POOLS.get(pool, GPU_TEMPLATE)
            spec = WorkPoolCreate(name=pool, type="process", base_job_template=deployment_file.pool_template(template),
                                  description=f"Local process pool `{pool}` (gpt2 stack)",
                                  concurrency_limit=None if pool == CPU_POOL else 1)
            c.create_work_pool(spec, overwrite=True)


def apply_automations(api_url: str, auth: str, max_reschedules: int,
                      zombie_after_s: int = deployment_file.DEFAULT_ZOMBIE_AFTER_S,
                      reschedule_after_s: int = deployment_file.DEFAULT_RESCHEDULE_AFTER_S) -> list[str]:
    """Create every automation on the stack's server, replacing ones of the same name; returns their names."""
    with client(api_url, auth) as c:
        return replace_automations(c, max_reschedules, zombie_after_s, reschedule_after_s)


def replace_automations(c, max_reschedules: int, zombie_after_s: int,
                        reschedule_after_s: int = deployment_file.DEFAULT_RESCHEDULE_AFTER_S) -> list[str]:
    """Through Prefect client `c`: every automation of deployments/automations/,
    each replacing those of its name, so applying twice leaves one of each
    (`prefect automation create` would add a second); returns their names."""
    from prefect.events.schemas.automations import AutomationCore

    names = []
    for spec in deployment_file.automations(max_reschedules, zombie_after_s, reschedule_after_s):
        for old in c.read_automations_by_name(spec["name"]):
            c.delete_automation(old.id)
        c.create_automation(AutomationCore.model_validate(spec))
        names.append(spec["name"])
    return names


def deploy_all(api_url: str, auth: str, env: dict[str, str], log_path: str,
               names: list[str] | None = None) -> None:
    """`prefect deploy --all` from the project directory against the stack's
    server; `names`: only these deployments (`prefect deploy -n … -n …`), those
    on the pools the stack stands up (prefect deploy refuses a missing pool)."""
    selection = [arg for name in names for arg in ("-n", name)] if names is not None else ["--all"]
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", *selection]
    with open(log_path, "ab") as log:
        done = subprocess.run(cmd, cwd=deployment_file.PROJECT_DIR, env={**env, **client_env(api_url, auth)},
                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"`prefect deploy {' '.join(selection)}` failed (exit {done.returncode}); see {log_path}")


def pool_status(api_url: str, auth: str | None, pools: Iterable[str] = tuple(LOCAL_POOLS)) -> dict[str, str | None]:
    """Each local pool's status (READY once a worker polls it), None if missing."""
    from prefect.exceptions import ObjectNotFound

    out: dict[str, str | None] = {}
    with client(api_url, auth) as c:
        for pool in pools:
            try:
                status = c.read_work_pool(pool).status
                out[pool] = status.value if status else None
            except ObjectNotFound:
                out[pool] = None
    return out
