"""`gpt2 stack up|status|down` for real: servers, workers and `prefect`
commands as separate processes on loopback, in a fresh $HOME."""

from __future__ import annotations

import stat
from pathlib import Path

import psutil
import pytest

from cli.stack import processes
from tests.cli.stack.fixtures import clean_env, gpt2, last_json, prefect

pytestmark = pytest.mark.e2e

DEPLOYMENTS = {"gpt2/full-pipeline", "gpt2-data/data", "gpt2-train/train", "gpt2-eval/evaluate", "gpt2-export/export"}


@pytest.fixture
def home(tmp_path):
    """A fresh $HOME whose active Prefect profile is a user's own `mine`."""
    home = tmp_path / "home"
    (home / ".prefect").mkdir(parents=True)
    (home / ".prefect" / "profiles.toml").write_text(
        'active = "mine"\n\n[profiles.mine]\nPREFECT_LOGGING_LEVEL = "WARNING"\n')
    (home / ".prefect" / "profiles.toml").chmod(0o644)  # a user's own file, readable by others
    yield home
    gpt2(clean_env(home), tmp_path, "stack", "down", check=False)  # whatever the test left running


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _api_view(api_url: str, auth: str) -> dict:
    from cli.stack.prefect_setup import client

    with client(api_url, auth) as c:
        pools = c.read_work_pools()
        return {"pools": {p.name: p.base_job_template for p in pools},
                "limits": {p.name: p.concurrency_limit for p in pools},
                "automations": {a.name: a for a in c.read_automations()},
                "workers": {pool: [w.name for w in c.read_workers_for_work_pool(pool)] for pool in ("cpu", "gpu")}}


def _assert_private(up: dict, home: Path) -> str:
    """The stack directory and its auth file are owner-only; the profile that
    carries the auth string to `prefect` commands became owner-only too."""
    state_dir, auth_file = Path(up["state_dir"]), Path(up["prefect_auth_file"])
    assert auth_file.parent == state_dir and stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
    auth = auth_file.read_text().strip()
    profiles = home / ".prefect" / "profiles.toml"
    assert stat.S_IMODE(profiles.stat().st_mode) == 0o600
    assert f'PREFECT_API_AUTH_STRING = "{auth}"' in profiles.read_text()
    return auth


def test_up_status_down_in_a_fresh_home(home, tmp_path):
    from flows import deployment_file

    env, cwd = clean_env(home), tmp_path  # not the project dir: works from anywhere
    up = last_json(gpt2(env, cwd, "stack", "up", "--root", str(tmp_path / "root"), "--json"))
    assert up["healthy"] and not up["already_up"]
    assert up["prefect_api_url"].startswith("http://127.0.0.1:") and up["mlflow_url"].startswith("http://127.0.0.1:")
    assert up["root"] == f"file://{tmp_path / 'root'}"
    assert Path(up["state_dir"]) == home / ".cache" / "gpt2-pipeline" / "stack"
    auth = _assert_private(up, home)
    assert all(part["healthy"] for part in up["parts"].values())
    assert set(up["parts"]) == {"server", "mlflow", "worker-cpu", "worker-gpu", "rescheduler"}
    pids = {name: part["pid"] for name, part in up["parts"].items()}

    status = last_json(gpt2(env, cwd, "stack", "status", "--json"))
    assert status["healthy"] and status["active_profile"] == "gpt2-local"
    assert {k: status[k] for k in ("prefect_api_url", "mlflow_url", "root", "mlflow_runs_url")} == {
        k: up[k] for k in ("prefect_api_url", "mlflow_url", "root", "mlflow_runs_url")}
    assert status["mlflow_runs_url"].startswith(up["mlflow_url"] + "/#/experiments/")  # the runs table, as up's
    again = last_json(gpt2(env, cwd, "stack", "up", "--json"))
    assert again["already_up"] and {n: p["pid"] for n, p in again["parts"].items()} == pids

    # Plain `prefect` commands in the same shell reach the stack through the profile.
    assert {"cpu", "gpu"} <= set(prefect(env, cwd, "work-pool", "ls").split())
    listed = prefect(env, cwd, "deployment", "ls")
    assert all(name in listed for name in DEPLOYMENTS), listed
    view = _api_view(up["prefect_api_url"], auth)
    assert view["pools"]["gpu"] == deployment_file.pool_template("process-gpu")
    assert view["pools"]["cpu"] == deployment_file.pool_template("process-cpu")
    assert view["limits"] == {"cpu": None, "gpu": 1}
    assert set(view["automations"]) == {"gpt2-reschedule-preempted", "gpt2-reschedule-cap", "gpt2-zombie-runs"}
    assert view["workers"] == {"cpu": ["gpt2-cpu"], "gpu": ["gpt2-gpu"]}
    assert processes.http_ok(f"{up['mlflow_url']}/health")

    started = [psutil.Process(pid) for pid in pids.values()]
    started += [child for proc in started for child in proc.children(recursive=True)]  # uvicorn, job runners
    # MLflow serves runs only: no job runner and huey consumers (MLflow's GenAI jobs) beside it.
    mlflow_tree = [" ".join(p.cmdline()) for p in psutil.Process(pids["mlflow"]).children(recursive=True)]
    assert not [c for c in mlflow_tree if "huey" in c or "job_runner" in c], mlflow_tree
    # The rescheduler (flows.reschedule) runs and reaches the server.
    log = Path(up["parts"]["rescheduler"]["log"]).read_text()
    assert "rescheduler: every" in log and "does not answer" not in log, log
    down = last_json(gpt2(env, cwd, "stack", "down", "--json"))
    assert sorted(down["stopped"]) == sorted(pids) and down["profile"] == "mine"
    assert not [p for p in started if _running(p)]
    assert not processes.http_ok(f"{up['prefect_api_url']}/health", timeout=1)
    assert down["seconds"]["rescheduler"] < processes.STOP_S  # it stops at its SIGTERM, not at the SIGKILL
    profiles = (home / ".prefect" / "profiles.toml").read_text()
    assert 'active = "mine"' in profiles and "gpt2-local" not in profiles and auth not in profiles
    after = gpt2(env, cwd, "stack", "status", "--json", check=False)
    assert after.returncode == 1 and not last_json(after)["up"]
