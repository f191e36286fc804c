"""prefect.yaml against the code it deploys: entrypoints, parameters (with
Prefect's own parameter schema and validation), pools, tags, the pull step."""

from __future__ import annotations

import asyncio
import os

import pytest
import yaml
from prefect.cli.deploy._models import PrefectYamlModel
from prefect.deployments.steps.core import run_steps
from prefect.exceptions import ParameterTypeError, SignatureMismatchError
from prefect.flows import load_flow_from_entrypoint
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import ValidationError, validate

from cli.stack.prefect_setup import LOCAL_POOLS, stack_pools
from flows import deployment_file
from gpt2.config.overrides import KNOWN_KEYS, resolve_config

EXPECTED = {  # deployment -> (pool, GPU stage?)
    "gpt2/full-pipeline": ("cpu", False),
    "gpt2/sweep": ("cpu", False),  # a parent of full-pipeline runs (flows.sweep)
    "gpt2-data/data": ("cpu", False),
    "gpt2-train/train": ("gpu", True),
    "gpt2-eval/evaluate": ("gpu", True),
    "gpt2-export/export": ("cpu", False),
    # The ladder of GPU pools' rungs beside `gpu` (runtime.gpu_pools).
    "gpt2-train/train-gpu-spot": ("gpu-spot", True),
    "gpt2-eval/evaluate-gpu-spot": ("gpu-spot", True),
    "gpt2-train/train-gpu-sky": ("gpu-sky", True),
    "gpt2-eval/evaluate-gpu-sky": ("gpu-sky", True),
}


def _deployments():
    """(full name, spec, flow) for every deployment in prefect.yaml."""
    out = []
    for spec in deployment_file.deployments():
        flow = load_flow_from_entrypoint(spec["entrypoint"])
        out.append((f"{flow.name}/{spec['name']}", spec, flow))
    return out


DEPLOYMENTS = _deployments()
IDS = [name for name, _, _ in DEPLOYMENTS]


def test_prefect_accepts_the_file_and_deploys_exactly_the_expected_set():
    # `prefect deploy` only warns and skips a file that fails this model.
    model = PrefectYamlModel.model_validate(yaml.safe_load(deployment_file.PREFECT_YAML.read_text()))
    assert len(model.deployments) == len(EXPECTED)
    assert sorted(IDS) == sorted(EXPECTED)


def test_parent_flow_starts_exactly_these_stage_deployments():
    from flows.stages import DEPLOYMENTS as PARENT_REFS

    assert set(PARENT_REFS.values()) == {n for n, (pool, _) in EXPECTED.items() if pool in ("cpu", "gpu")} - {
        "gpt2/full-pipeline", "gpt2/sweep"}


def test_the_sweep_starts_the_deployed_pipeline_and_reads_the_train_deployments_slots():
    from flows import sweep

    assert sweep.PIPELINE_DEPLOYMENT in EXPECTED and sweep.TRAIN_DEPLOYMENT in EXPECTED
    # On a ladder of GPU pools, members start on the first rung: its train deployment's slots count.
    ladder = resolve_config("smoke", {"runtime.gpu_pools": "gpu-spot:1.1,gpu:3.9"})
    assert sweep.train_deployment(ladder) == "gpt2-train/train-gpu-spot" in EXPECTED
    assert sweep.train_deployment(resolve_config("smoke")) == sweep.TRAIN_DEPLOYMENT


@pytest.mark.parametrize("name,spec,flow", DEPLOYMENTS, ids=IDS)
def test_parameters_match_the_flow_signature(name, spec, flow):
    params = spec["parameters"]
    # Prefect's OpenAPI schema of the signature, as the server and UI validate runs with.
    schema = parameter_schema(flow).model_dump_for_openapi()
    validate(params, schema, raise_on_error=True, ignore_required=False)
    # and the engine's own check (pydantic, by the signature) before a run starts
    flow.validate_parameters(params)
    assert set(params) == {"preset", "overrides"}, "deployments name a preset and overrides only"
    assert set(params["overrides"]) <= KNOWN_KEYS and len(params["overrides"]) <= 3
    resolve_config(params["preset"], params["overrides"])  # the config they make is valid


@pytest.mark.parametrize("bad", [{"preset": 3}, {"overrides": ["train.max_steps=1"]}, {"presets": "smoke"}])
def test_the_same_checks_reject_wrong_parameters(bad):
    _, spec, flow = DEPLOYMENTS[IDS.index("gpt2-train/train")]
    schema = parameter_schema(flow).model_dump_for_openapi()
    params = {**spec["parameters"], **bad}
    with pytest.raises((ValidationError, ParameterTypeError, SignatureMismatchError)):
        validate(params, schema, raise_on_error=True)
        flow.validate_parameters(params)


@pytest.mark.parametrize("name,spec,flow", DEPLOYMENTS, ids=IDS)
def test_pools_and_tags(name, spec, flow):
    pool, gpu = EXPECTED[name]
    assert spec["work_pool"]["name"] == pool
    assert spec["work_pool"]["name"] in stack_pools([pool] if pool not in LOCAL_POOLS else [], [])  # `gpt2 stack up` has it
    tags = set(spec.get("tags") or [])
    if gpu:  # selected by the reschedule and zombie automations
        assert {"gpu", "preemptible"} <= tags
    elif name in ("gpt2/full-pipeline", "gpt2/sweep"):  # parents: watched and rescheduled, with 30 s heartbeats
        assert {"pipeline", "preemptible"} <= tags and "gpu" not in tags
        env = spec["work_pool"]["job_variables"]["env"]
        assert env[deployment_file.HEARTBEAT_ENV] == str(deployment_file.GPU_HEARTBEAT_S)
    else:  # a cpu stage: rescheduled when its machine dies (cached, idempotent), never a zombie watch
        assert "preemptible" in tags and not tags & {"gpu", "pipeline"}


def test_pull_step_moves_the_flow_run_into_the_project_dir(tmp_path, monkeypatch, prefect_server):
    steps = deployment_file.pull_steps()
    assert [next(iter(s)) for s in steps] == ["prefect.deployments.steps.set_working_directory"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(deployment_file.PROJECT_DIR_ENV, str(deployment_file.PROJECT_DIR))
    asyncio.run(run_steps(steps))  # resolves {{ $GPT2_PROJECT_DIR }} as a flow-run process does
    assert os.getcwd() == str(deployment_file.PROJECT_DIR)
    for spec in deployment_file.deployments():  # and the entrypoints resolve from there
        assert (deployment_file.PROJECT_DIR / spec["entrypoint"].split(":")[0]).is_file()


def test_the_pools_gpu_count_alone_sets_the_training_processes():
    """No process count in the train deployment: runtime.nproc_per_node=auto
    starts one process per GPU of the machine the pool gives the run."""
    _, spec, _ = DEPLOYMENTS[IDS.index("gpt2-train/train")]
    params = spec["parameters"]
    assert "runtime.nproc_per_node" not in params["overrides"]
    assert resolve_config(params["preset"], params["overrides"]).runtime.nproc_per_node == "auto"


@pytest.mark.parametrize("name", [n for n, (_, gpu) in EXPECTED.items() if gpu])
def test_gpu_deployments_have_a_concurrency_limit_that_queues(name):
    """A cost guardrail: a second run of a GPU deployment waits for the first
    instead of renting a second GPU machine."""
    model = PrefectYamlModel.model_validate(yaml.safe_load(deployment_file.PREFECT_YAML.read_text()))
    _, spec, _ = DEPLOYMENTS[IDS.index(name)]
    (deployment,) = [d for d in model.deployments if d.name == spec["name"]]
    assert deployment.concurrency_limit.limit >= 1
    assert deployment.concurrency_limit.collision_strategy == "ENQUEUE"


@pytest.mark.parametrize("image", ["registry.example/gpt2:abc123", None])
def test_the_gpu_image_is_resolved_where_prefect_deploy_runs(image, monkeypatch):
    """The two templating passes of `prefect deploy` (the environment, then the
    build steps' outputs): $GPT2_IMAGE becomes the GPU deployments' image; unset,
    it is empty, which a container pool refuses (test_job_templates) and a
    process pool ignores."""
    from prefect.utilities.templating import apply_values

    if image:
        monkeypatch.setenv("GPT2_IMAGE", image)
    else:
        monkeypatch.delenv("GPT2_IMAGE", raising=False)
    for name, spec, _ in DEPLOYMENTS:
        config = apply_values(apply_values(spec, os.environ, remove_notset=False), {}, warn_on_notset=False)
        variables = config["work_pool"].get("job_variables") or {}
        assert variables.get("image") == ((image or "") if EXPECTED[name][1] else None)


def test_every_rung_is_the_gpu_deployment_on_its_own_pool():
    """A rung's deployments differ from the `gpu` pool's only in name and pool
    (prefect.yaml's anchors): same flow, parameters, tags, concurrency guardrail."""
    specs = {spec["name"]: spec for spec in deployment_file.deployments()}
    rungs = {spec["work_pool"]["name"] for spec in specs.values()} - set(LOCAL_POOLS)
    assert rungs == {"gpu-spot", "gpu-sky"}
    assert deployment_file.missing_rungs(sorted(rungs) + ["gpu"]) == []
    for pool in rungs:
        for stage in ("train", "evaluate"):
            rung, base = dict(specs[f"{stage}-{pool}"]), dict(specs[stage])
            assert rung.pop("work_pool")["name"] == pool and base.pop("work_pool")["name"] == "gpu"
            assert {**rung, "name": stage} == base


def test_a_ladder_naming_a_pool_without_deployments_is_found_out():
    assert deployment_file.missing_rungs(["gpu-spot", "gpu-nowhere", "gpu"]) == [
        "train-gpu-nowhere (on work pool gpu-nowhere)", "evaluate-gpu-nowhere (on work pool gpu-nowhere)"]
