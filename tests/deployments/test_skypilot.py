"""deployments/skypilot/gpu-sky.yaml, the SkyPilot task that is the `gpu-sky`
rung of the ladder of GPU pools: a Prefect process worker for a pool that
prefect.yaml deploys train and evaluate to, with what its flow runs need.

SkyPilot is not part of any install of this project: where it is importable,
its own parser reads the task offline (sky.Task.from_yaml_config: its schema,
its resources, its recovery strategies); everywhere, the keys that matter to
this project are checked on the YAML itself."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from flows import deployment_file
from gpt2.cost.gpus import gpu
from gpt2.ladder import rungs

TASK = deployment_file.DEPLOYMENTS_DIR / "skypilot" / "gpu-sky.yaml"
REQUIRED_ENVS = {"PREFECT_API_URL": "https://prefect.example.com/api", "GPT2_ROOT": "gs://bucket/gpt2"}


def _task() -> dict:
    return yaml.safe_load(TASK.read_text())


def _worker_command(task: dict) -> list[str]:
    """The `prefect worker start ...` line of the task's run script (its continuation lines joined)."""
    script = task["run"].replace("\\\n", " ")
    (line,) = [ln for ln in script.splitlines() if "prefect worker start" in ln]
    words = shlex.split(line)
    return words[words.index("prefect"):]


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_worker_serves_a_rung_that_prefect_yaml_deploys_train_and_evaluate_to():
    words = _worker_command(_task())
    pool = _option(words, "--pool")
    assert words[:3] == ["prefect", "worker", "start"] and _option(words, "--type") == "process"
    assert pool != rungs.DEFAULT_POOL and deployment_file.missing_rungs([pool]) == []
    # One flow run at a time: the machine is one GPU that train and evaluate must not share.
    assert _option(words, "--limit") == "1"


def test_the_worker_gets_the_server_the_root_the_heartbeats_and_the_project_dir():
    task = _task()
    envs = task["envs"]
    # Required at launch (SkyPilot refuses a null env that --env did not set).
    assert {k: envs[k] for k in REQUIRED_ENVS} == dict.fromkeys(REQUIRED_ENVS)
    # The zombie automation watches GPU runs' heartbeats (deployments/automations/zombie-runs.yaml).
    assert envs[deployment_file.HEARTBEAT_ENV] == str(deployment_file.GPU_HEARTBEAT_S)
    # prefect.yaml's pull step moves every flow run into $GPT2_PROJECT_DIR; the run script fills it in.
    assert deployment_file.PROJECT_DIR_ENV in envs
    assert f'export {deployment_file.PROJECT_DIR_ENV}="${{{deployment_file.PROJECT_DIR_ENV}:-$PWD}}"' in task["run"]
    assert task["workdir"] == "."
    # The API key is a secret (SkyPilot redacts it), never a plain env shown with the job.
    assert "PREFECT_API_KEY" in task["secrets"] and "PREFECT_API_KEY" not in envs


def test_spot_gpus_the_plan_knows_with_a_recovery_strategy():
    resources = _task()["resources"]
    assert resources["use_spot"] is True
    assert resources["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"
    assert resources["job_recovery"]["max_restarts_on_errors"] >= 1
    for name, count in resources["accelerators"].items():
        assert gpu(name).memory_gib >= 40 and count == 1  # `gpt2 plan --gpu NAME` prices each choice


def test_setup_installs_the_project_with_the_torch_the_image_pins():
    setup = _task()["setup"]
    dockerfile = (deployment_file.DEPLOYMENTS_DIR / "Dockerfile").read_text()
    pinned = re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.M).group(1)
    assert f'pip install "torch=={pinned}"' in setup
    assert re.search(r'pip install -e "\.\[[a-z0-9,]*gcs[a-z0-9,]*\]"', setup)
    assert setup.lstrip().startswith("set -e")  # a failed install fails the launch, not the first flow run


def test_skypilots_own_parser_reads_the_task_offline():
    """Needs SkyPilot (`pip install skypilot`, kept out of this project's extras)."""
    sky = pytest.importorskip("sky")
    from sky.jobs import recovery_strategy  # noqa: F401  (registers the strategies)
    from sky.utils import registry

    with pytest.raises(ValueError, match="PREFECT_API_URL"):
        sky.Task.from_yaml_config(_task())  # required envs are asked for at launch
    task = sky.Task.from_yaml_config(_task(), env_overrides=list(REQUIRED_ENVS.items()),
                                     secrets_overrides=[("PREFECT_API_KEY", "pnu_example")])
    assert task.name == "gpt2-gpu-sky" and task.envs["GPT2_ROOT"] == REQUIRED_ENVS["GPT2_ROOT"]
    choices = list(task.resources)
    assert {next(iter(r.accelerators)) for r in choices} == set(_task()["resources"]["accelerators"])
    assert all(r.use_spot for r in choices)
    strategy = choices[0].job_recovery["strategy"]
    assert strategy.lower() in registry.JOBS_RECOVERY_STRATEGY_REGISTRY.keys()

