"""The local stack: a Prefect server, an MLflow server and one worker per pool,
as background processes on free loopback ports.

    gpt2 stack up        # start, configure (pools, automations, deployments), switch profile
    gpt2 stack status    # health of each part
    gpt2 stack down      # stop what `up` started, restore the previous profile

State (stack.json, logs, the Prefect and MLflow SQLite databases, the Prefect
server's auth string) lives in $GPT2_STACK_DIR, default
~/.cache/gpt2-pipeline/stack, a directory only its owner can read; `down` keeps
the databases and the auth string, so the next `up` shows earlier runs and
browsers and workers that hold the string stay logged in.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from cli.stack import prefect_setup, processes, server_logging
from flows import deployment_file

STATE_FILE = "stack.json"
AUTH_FILE = "prefect-auth"  # the Prefect server's auth string, `user:password` as the UI's login form expects
AUTH_USER = "gpt2"
SERVER_START_S = 120  # ~11 s on an idle 2-core machine; far more while MLflow starts beside it
MLFLOW_START_S = 120


def default_state_dir() -> Path:
    return Path(os.environ.get("GPT2_STACK_DIR") or Path.home() / ".cache" / "gpt2-pipeline" / "stack")


def _private_dir(state_dir: Path) -> None:
    """Create the stack directory owner-only (0700), or tighten an existing one:
    it holds the auth string, the databases and logs full of parameters.

    A directory that is not the user's own, or a sticky one (such as /tmp), is
    shared with others: refuse it rather than lock them out of it."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = state_dir.stat()
    if info.st_uid != os.getuid() or info.st_mode & stat.S_ISVTX:
        raise processes.ServiceError(f"{state_dir} is shared with other users; give the stack a directory of its own "
                                     "(--state-dir or $GPT2_STACK_DIR)")
    if info.st_mode & 0o077:
        state_dir.chmod(0o700)


def _auth_string(state_dir: Path) -> str:
    """The stack's auth string: made once per stack directory (owner-only file)
    and kept, so that a browser's login and remote workers survive `down`/`up`.
    Delete the file to change it."""
    path = state_dir / AUTH_FILE
    if not read_auth(state_dir):
        tmp = state_dir / f"{AUTH_FILE}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o600)  # a leftover tmp may have had any mode
            out.write(f"{AUTH_USER}:{secrets.token_urlsafe(32)}\n")
        tmp.replace(path)  # never a half-written string under the real name
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    return read_auth(state_dir)


def read_auth(state_dir: Path) -> str | None:
    """The auth string of the stack in `state_dir`, None if it has none."""
    try:
        return (state_dir / AUTH_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((state_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        return None


def _write_state(state_dir: Path, state: dict[str, Any]) -> None:
    tmp = state_dir / f"{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_dir / STATE_FILE)


def default_root() -> str:
    """Where the deployments write by default: the config's default root,
    resolved in the project directory that prefect.yaml's pull step moves
    each flow run into."""
    from gpt2.config.runtime import RuntimeConfig
    from gpt2.root import storage

    root = RuntimeConfig().root
    if root.startswith("file://") and not Path(root[len("file://"):]).is_absolute():
        return storage.normalize_url(str(deployment_file.PROJECT_DIR / root[len("file://"):]))
    return storage.normalize_url(root)


def _mlflow_store(root: str, state_dir: Path) -> tuple[str, str]:
    """(backend store URI, artifacts destination) of the MLflow server.

    A local root: the very SQLite file and artifact directory that the stages'
    embedded default (gpt2.tracking) writes for that root, so the server shows
    every run of that root, whether it was logged through the server or not.
    """
    from gpt2.root import storage
    from gpt2.tracking.store import seed_sqlite_store

    # By scheme: instantiating a cloud filesystem may probe for credentials.
    path = Path(root[len("file://"):]) if root.startswith("file://") else None
    base = path if path is not None else state_dir
    base.mkdir(parents=True, exist_ok=True)
    artifacts = storage.join(root, "mlflow-artifacts") if path is not None else str(state_dir / "mlflow-artifacts")
    seed_sqlite_store(base / "mlflow.db")  # the server would spend seconds migrating a new one
    return f"sqlite:///{base / 'mlflow.db'}", artifacts


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_PROFILE"}
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"  # no network; telemetry can lock SQLite
    env["MLFLOW_ENABLE_TELEMETRY"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


LEASES_DIR_ENV = "GPT2_STACK_LEASES_DIR"
"""Where the stack's server keeps its concurrency leases (cli.stack.lease_storage,
which is not imported here: it imports Prefect's server, seconds of a `gpt2` command)."""


def _server_env(env: dict[str, str], state_dir: Path, port: int, auth: str) -> dict[str, str]:
    logging_setup = server_logging.write(state_dir)  # the automations' triggers say what they do
    if logging_setup is not None:
        env = {**env, "PREFECT_LOGGING_SETTINGS_PATH": str(logging_setup)}
    return {**env, "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{state_dir / 'prefect.db'}",
            # SQLite serializes writers; on a busy machine the default 10 s wait
            # loses event messages (and with them automation firings).
            "PREFECT_API_DATABASE_TIMEOUT": "60",
            # Remember across a restart which events it had seen (cli.stack.event_ordering):
            # else automations act on a flow run's crash up to 15 minutes late after one.
            "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING": "cli.stack.event_ordering",
            # Keep concurrency leases on disk (cli.stack.lease_storage): else a restart loses a
            # GPU run's deployment slot, and Prefect cancels the run at its next lease renewal.
            "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "cli.stack.lease_storage",
            LEASES_DIR_ENV: str(state_dir / "concurrency-leases"),
            # Every request but /health needs the auth string (the UI asks for it
            # in a login form); state-changing ones also a CSRF token, which
            # Prefect's clients and the UI fetch by themselves.
            "PREFECT_SERVER_API_AUTH_STRING": auth, "PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "true",
            # The UI asks /ui-settings where the API is; left alone, that is the
            # default 127.0.0.1:4200, not this server's port.
            "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_UI_URL": f"http://127.0.0.1:{port}",
            # `prefect deployment run ... --watch` streams a run's logs beside its events only when the
            # server publishes and streams them out (both off by default): else it shows heartbeats alone.
            "PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED": "true", "PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED": "true"}


def seed_prefect_db(path: Path) -> None:
    """A Prefect database that does not exist yet starts as a migrated empty
    copy (gpt2.tracking.store): the server's own migrations take ~25 s of a
    fresh `gpt2 stack up` otherwise."""
    import prefect

    from gpt2.tracking import store

    store.seed(path, f"prefect-{prefect.__version__}-empty.db", _migrate_prefect_db)


def _migrate_prefect_db(path: Path) -> None:
    env = {**_base_env(), "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{path}"}
    subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env, check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)


def _start_server(state: dict[str, Any], state_dir: Path, env: dict[str, str], auth: str,
                  port: int | None = None) -> None:
    seed_prefect_db(state_dir / "prefect.db")
    port = port or processes.free_port()
    state["prefect_ui_url"] = f"http://127.0.0.1:{port}"
    state["prefect_api_url"] = f"http://127.0.0.1:{port}/api"
    state["processes"].append(processes.start(
        "server", [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        _server_env(env, state_dir, port, auth), state_dir, state_dir / "logs"))


def _start_mlflow(state: dict[str, Any], state_dir: Path, env: dict[str, str], port: int | None = None) -> None:
    mport = port or processes.free_port()
    state["mlflow_url"] = f"http://127.0.0.1:{mport}"
    store, artifacts = _mlflow_store(state["root"], state_dir)
    state["processes"].append(processes.start(
        "mlflow", [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(mport),
                   "--workers", "1", "--backend-store-uri", store, "--serve-artifacts",
                   "--artifacts-destination", artifacts],
        # MLflow's job execution (its GenAI jobs and trace rollups) serves
        # nothing the pipeline uses; on by default it starts a job runner and
        # seven huey consumers beside the server, each a Python that imports
        # MLflow and polls: CPU the stack's own machine would pay for nothing.
        {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, state_dir, state_dir / "logs"))


def _start_workers(state: dict[str, Any], state_dir: Path, env: dict[str, str], auth: str,
                   pools: list[str] | None = None) -> None:
    """Start one worker per pool that has one (`pools`: only these)."""
    from gpt2.config.runtime import ROOT_ENV

    # The worker hands its Prefect settings (auth string included) on to each flow run it starts.
    worker_env = {**env, **prefect_setup.client_env(state["prefect_api_url"], auth),
                  "MLFLOW_TRACKING_URI": state["mlflow_url"],
                  ROOT_ENV: state["root"],  # deployment runs write under the stack's root
                  deployment_file.PROJECT_DIR_ENV: str(deployment_file.PROJECT_DIR),
                  "PREFECT_WORKER_QUERY_SECONDS": "5"}  # a local stack: pick runs up quickly
    for pool in pools or _worker_pools(state):
        # GPU runs send heartbeats for zombie detection. (No `--limit` here: in
        # Prefect 3.8 a worker with a limit dies when a crashed run it still
        # counts comes back rescheduled; the gpu pools' own limit serves instead.)
        gpu = pool != prefect_setup.CPU_POOL
        extra = {deployment_file.HEARTBEAT_ENV: str(deployment_file.GPU_HEARTBEAT_S)} if gpu else {}
        # Prefect's worker, reporting a crash once (cli.stack.worker says why).
        cmd = [sys.executable, "-m", "cli.stack.worker", "start", "--pool", pool, "--type", "process",
               "--name", f"gpt2-{pool}"]
        state["processes"].append(processes.start(f"worker-{pool}", cmd, {**worker_env, **extra},
                                                  deployment_file.PROJECT_DIR, state_dir / "logs"))


def _start_rescheduler(state: dict[str, Any], state_dir: Path, env: dict[str, str], auth: str) -> None:
    """The stack's controller (cli.stack.rescheduler): puts back a crashed
    preemptible run the reschedule automation missed, the pipeline's parent
    too, and hands a run stranded in Pending by a dead worker back to its pool."""
    state["processes"].append(processes.start(
        "rescheduler", [sys.executable, "-m", "cli.stack.rescheduler", "--state-dir", str(state_dir)],
        {**env, **prefect_setup.client_env(state["prefect_api_url"], auth)}, deployment_file.PROJECT_DIR,
        state_dir / "logs"))


def _pools(state: dict[str, Any]) -> dict[str, bool]:
    """The stack's pools, each with whether a worker polls it (a state file
    from before the ladder of GPU pools has the two pools, both with workers)."""
    return state.get("pools") or {pool: True for pool in prefect_setup.LOCAL_POOLS}


def _worker_pools(state: dict[str, Any]) -> list[str]:
    return [pool for pool, worker in _pools(state).items() if worker]


def _wait_pools_ready(api_url: str, auth: str, timeout: float, pools: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s == "READY" for s in prefect_setup.pool_status(api_url, auth, pools).values()):
            return
        time.sleep(1)
    raise processes.ServiceError(f"workers did not start polling within {timeout:.0f} s: "
                                 f"{prefect_setup.pool_status(api_url, auth, pools)}")


def _procs(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in state["processes"]}


def up(state_dir: Path, root: str | None = None, max_reschedules: int = deployment_file.DEFAULT_MAX_RESCHEDULES,
       say: Callable[[str], None] = print,
       zombie_after_s: int = deployment_file.DEFAULT_ZOMBIE_AFTER_S,
       pools: dict[str, bool] | None = None,
       reschedule_after_s: int = deployment_file.DEFAULT_RESCHEDULE_AFTER_S) -> dict[str, Any]:
    """Start the stack, or return the running one; stops a half-dead one first.

    `root` is the artifact root whose MLflow store the server serves (default:
    where the deployments write by default); runs with another
    `runtime.root` log to that root's own store. `pools`: the work pools to
    stand up, each with whether a worker polls it (prefect_setup.stack_pools;
    default `cpu` and `gpu`, both with workers)."""
    pools = pools or {pool: True for pool in prefect_setup.LOCAL_POOLS}
    _private_dir(state_dir)
    with open(state_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second `up` at the same time waits, then finds this stack
        existing = read_state(state_dir)
        if existing and status(state_dir)["healthy"]:
            say("the stack is already up")
            if _pools(existing) != pools:
                say(f"note: its pools are {describe_pools(_pools(existing))}, not {describe_pools(pools)}: "
                    "`gpt2 stack down` first to change them")
            return {**existing, "already_up": True}
        if existing:
            say("stopping the leftovers of an earlier stack")
            down(state_dir)
        return _start(state_dir, root, (max_reschedules, zombie_after_s, reschedule_after_s), say, pools)


def describe_pools(pools: dict[str, bool]) -> str:
    return ", ".join(pool + ("" if worker else " (no worker)") for pool, worker in pools.items())


def _start(state_dir: Path, root: str | None, watch: tuple[int, int, int], say: Callable[[str], None],
           pools: dict[str, bool]) -> dict[str, Any]:
    """`watch`: (max_reschedules, zombie_after_s, reschedule_after_s) for the automations."""
    from gpt2.root import storage

    state: dict[str, Any] = {"root": storage.normalize_url(root) if root else default_root(),
                             "project_dir": str(deployment_file.PROJECT_DIR), "state_dir": str(state_dir),
                             "profile": prefect_setup.PROFILE, "previous_profile": prefect_setup.active_profile(),
                             "pools": pools, "processes": []}
    try:
        _up(state, state_dir, watch, say)
    except BaseException:
        _write_state(state_dir, state)
        down(state_dir)
        raise
    return state


def _up(state: dict[str, Any], state_dir: Path, watch: tuple[int, int, int], say: Callable[[str], None]) -> None:
    env, auth = _base_env(), _auth_string(state_dir)
    say("starting the Prefect server and the MLflow server")
    _start_server(state, state_dir, env, auth)
    _start_mlflow(state, state_dir, env)
    _write_state(state_dir, state)  # from here on, `down` can stop what was started
    api, procs = state["prefect_api_url"], _procs(state)
    processes.wait_http(procs["server"], f"{api}/health", SERVER_START_S)  # /health needs no auth string
    say("creating work pools and automations")
    prefect_setup.create_pools(api, auth, _pools(state))
    state["automations"] = prefect_setup.apply_automations(api, auth, *watch)
    _start_workers(state, state_dir, env, auth)
    _start_rescheduler(state, state_dir, env, auth)
    _write_state(state_dir, state)
    say("deploying prefect.yaml")
    prefect_setup.deploy_all(api, auth, env, str(state_dir / "logs" / "deploy.log"),
                             prefect_setup.stack_deployments(_pools(state)))
    processes.wait_http(procs["mlflow"], f"{state['mlflow_url']}/health", MLFLOW_START_S)
    _wait_pools_ready(api, auth, 60, _worker_pools(state))
    state["previous_profile"] = prefect_setup.use_profile(api, auth)
    _write_state(state_dir, state)


def restart_server(state_dir: Path, away_s: float = 0.0) -> dict[str, Any]:
    """Stop the stack's Prefect server and start it again on the same port and
    database after `away_s` seconds, as a platform brings a server back (an
    upgrade, an OOM kill): its clients, workers and running flows keep their
    URL. Returns the new server's process record."""
    return restart(state_dir, "server", away_s)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def restart(state_dir: Path, name: str, away_s: float = 0.0) -> dict[str, Any]:
    """Bring one part of the stack back (`server`, `mlflow`, `rescheduler` or `worker-<pool>`)
    as systemd or Kubernetes would: stop what is left of it, wait `away_s`,
    start it again on the same port, database and pool, wait until it answers.
    What a dead part left behind in its process group goes too (a server's
    uvicorn child would hold the port); a dead worker's flow runs, which run
    in sessions of their own, are left to Prefect, as on a real platform.
    Returns the new process record."""
    state = read_state(state_dir)
    if state is None:
        raise processes.ServiceError(f"no stack is recorded in {state_dir}")
    old = _procs(state).get(name)
    pool = name[len("worker-"):] if name.startswith("worker-") else None
    if old is None and (pool is None or pool not in _worker_pools(state)):
        raise processes.ServiceError(f"the stack in {state_dir} has no part named {name!r}; its parts: "
                                     f"{', '.join(_procs(state))}")
    if old is not None and processes.alive(old):
        stop_service(old)
    elif old is not None:
        processes.stop_leftovers(old)
    time.sleep(away_s)
    state = read_state(state_dir)  # another part may have been restarted meanwhile
    state["processes"] = [p for p in state["processes"] if p["name"] != name]
    env, auth = _base_env(), _auth_string(state_dir)
    if name == "server":
        _start_server(state, state_dir, env, auth, _port(state["prefect_api_url"]))
    elif name == "mlflow":
        _start_mlflow(state, state_dir, env, _port(state["mlflow_url"]))
    elif name == "rescheduler":
        _start_rescheduler(state, state_dir, env, auth)
    else:
        _start_workers(state, state_dir, env, auth, [pool])
    _write_state(state_dir, state)
    new = _procs(state)[name]
    if name == "server":
        processes.wait_http(new, f"{state['prefect_api_url']}/health", SERVER_START_S)
    elif name == "mlflow":
        processes.wait_http(new, f"{state['mlflow_url']}/health", MLFLOW_START_S)
    return new


WORKER_STOP_MARGIN_S = 15.0
"""Beyond the trainer's window: the flow run's own teardown (its final state, logs)."""


def stop_timeout(name: str) -> float:
    """How long `down` waits between SIGTERM and SIGKILL: a worker's flow runs
    may be training, and a trainer told to stop gets the launcher's whole window
    for its checkpoint (gpt2.process.kill_window.kill_window on a process pool);
    a SIGKILL before it ends loses the steps since the last periodic one."""
    if not name.startswith("worker"):
        return processes.STOP_S
    from gpt2.process.kill_window import kill_window  # imported only when stopping, as the rest of gpt2 is here

    return kill_window(distributed=False, pool="process")[0] + WORKER_STOP_MARGIN_S


def stop_service(rec: dict[str, Any]) -> list[str]:
    """Stop one of the stack's processes as `down` does: a worker's flow runs
    get the trainer's window (stop_timeout); a worker left alone, its flow runs
    exited, gets a server's (a Prefect worker told to stop can sit out the whole
    window by itself: seen on a busy machine, 135 s per worker). Returns what
    had to be killed."""
    return processes.stop(rec, stop_timeout(rec["name"]), alone_s=processes.STOP_S)


def down(state_dir: Path) -> dict[str, Any]:
    """Stop every recorded process (workers first, each given its flow runs'
    checkpoint window) and restore the previous profile."""
    state = read_state(state_dir)
    if state is None:
        return {"stopped": []}
    forced, seconds = {}, {}  # by the name of each process stopped, in the order stopped
    # Workers and the rescheduler first: nothing may start or put back a run while the server goes.
    for rec in sorted(state["processes"], key=lambda p: not (p["name"].startswith("worker") or
                                                           p["name"] == "rescheduler")):
        if processes.alive(rec):
            started = time.monotonic()
            left = stop_service(rec)
            seconds[rec["name"]] = round(time.monotonic() - started, 1)
            if left:  # what outlived its SIGTERM window: the reason a `down` was slow
                forced[rec["name"]] = left
    prefect_setup.restore_profile(state.get("previous_profile"))
    (state_dir / STATE_FILE).unlink()
    return {"stopped": list(seconds), "profile": prefect_setup.active_profile(), "seconds": seconds,
            "killed": forced}


def status(state_dir: Path) -> dict[str, Any]:
    """Health of every part; `healthy` only if all are."""
    state = read_state(state_dir)
    if state is None:
        return {"up": False, "healthy": False, "prefect_api_url": None, "mlflow_url": None,
                "root": default_root(), "state_dir": str(state_dir), "parts": {}}
    parts = {name: {"pid": rec["pid"], "alive": processes.alive(rec), "log": rec["log"]}
             for name, rec in _procs(state).items()}
    if "server" in parts:
        parts["server"]["healthy"] = processes.http_ok(f"{state['prefect_api_url']}/health")
    if "mlflow" in parts:
        parts["mlflow"]["healthy"] = processes.http_ok(f"{state['mlflow_url']}/health")
    healthy_server = parts.get("server", {}).get("healthy")
    watched = _worker_pools(state)
    pools = prefect_setup.pool_status(state["prefect_api_url"], read_auth(state_dir), watched) if healthy_server else {}
    for pool in watched:
        if f"worker-{pool}" in parts:
            part = parts[f"worker-{pool}"]
            part["pool"], part["pool_status"] = pool, pools.get(pool)
            part["healthy"] = part["alive"] and part["pool_status"] == "READY"
    for part in parts.values():  # a part with nothing to ask (the rescheduler) is healthy while it runs
        part.setdefault("healthy", part["alive"])
    expected = {"server", "mlflow", *(f"worker-{p}" for p in watched)}
    healthy = expected <= set(parts) and all(p["alive"] and p.get("healthy", True) for p in parts.values())
    keys = ("prefect_api_url", "prefect_ui_url", "mlflow_url", "root", "state_dir", "profile", "automations")
    return {"up": True, "healthy": healthy, **{k: state.get(k) for k in keys},
            "prefect_auth_file": str(state_dir / AUTH_FILE), "active_profile": prefect_setup.active_profile(),
            "parts": parts, "pools": _pools(state)}
