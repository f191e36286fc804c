"""deployments/Dockerfile cannot be built on machines without a container
engine; check what it promises against the files it relies on."""

from __future__ import annotations

import re

import tomllib
from packaging.requirements import Requirement

from flows import deployment_file

# Continuation lines joined, so each instruction is one line.
DOCKERFILE = re.sub(r"\\\n\s*", " ", (deployment_file.DEPLOYMENTS_DIR / "Dockerfile").read_text())
PYPROJECT = tomllib.loads((deployment_file.PROJECT_DIR / "pyproject.toml").read_text())


def _instruction(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, flags=re.MULTILINE)


def test_the_image_runs_the_torch_ci_tests():
    """One torch: the image installs, and pins, exactly the release `.ci/run`
    tests, and pyproject's range holds it (else pip would replace it)."""
    ci = (deployment_file.PROJECT_DIR / ".ci" / "run").read_text()
    (ci_torch,) = re.findall(r"pip install (?:--\S+ )*torch==(\d+\.\d+\.\d+)", ci)
    (base,) = _instruction("FROM")
    assert re.fullmatch(r"python:3\.\d+-slim", base.strip()), f"expected a plain Python base image, got {base}"
    args = dict(re.findall(r"(\w+)=(\S+)", " ".join(_instruction("ARG"))))
    assert args["TORCH_VERSION"] == ci_torch
    (install,) = [run for run in _instruction("RUN") if "torch==${TORCH_VERSION}" in run]
    assert "pip-constraints.txt" in install and install.index("pip install") < install.index("torch.__version__")
    torch = next(Requirement(d) for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch"))
    assert torch.specifier.contains(ci_torch), "pip would replace the image's torch"
    # The GPU machine's torch, on which the trainer core and benchmarks ran (bench/results.jsonl).
    assert torch.specifier.contains("2.11.0")


def test_code_dir_is_where_the_pull_step_goes():
    (workdir,) = _instruction("WORKDIR")
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(_instruction("ENV"))))
    assert env[deployment_file.PROJECT_DIR_ENV] == workdir.strip()
    (directory,) = [s["prefect.deployments.steps.set_working_directory"]["directory"]
                    for s in deployment_file.pull_steps()]
    assert directory.replace(" ", "") == "{{$" + deployment_file.PROJECT_DIR_ENV + "}}"


def test_installs_the_project_with_its_gcs_extra():
    assert any('pip install -e ".[gcs]"' in run for run in _instruction("RUN"))
    assert "gcs" in PYPROJECT["project"]["optional-dependencies"]
    ignored = (deployment_file.DEPLOYMENTS_DIR / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", "artifacts", ".git"} <= set(ignored)


def test_pid_1_is_an_init_process_that_passes_sigterm_on():
    """The Kubernetes job template puts the flow-run command in `args`, so the
    image's ENTRYPOINT (tini) stays PID 1 and forwards the kubelet's SIGTERM."""
    import json

    (entrypoint,) = _instruction("ENTRYPOINT")
    assert json.loads(entrypoint)[:2] == ["/usr/bin/tini", "--"]
    assert any("install" in run and "tini" in run for run in _instruction("RUN"))
    k8s = json.loads((deployment_file.DEPLOYMENTS_DIR / "pools" / "kubernetes-gpu.json").read_text())
    container = k8s["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container and container["args"] == "{{ command }}"


def test_a_c_compiler_is_installed_for_torch_compile():
    """The runtime base image has no compiler; runtime.compile=auto compiles on
    CUDA, and Triton (and inductor's CPU code) need one at run time."""
    installs = [run for run in _instruction("RUN") if "apt-get install" in run]
    assert any("build-essential" in run or re.search(r"\bgcc\b", run) for run in installs)


def test_dependency_layers_survive_code_changes():
    """pyproject.toml is copied and installed before the code: a code change
    rebuilds only the layers after `COPY . .`, where nothing is resolved."""
    lines = [line.strip() for line in DOCKERFILE.splitlines()]
    copy_all = lines.index("COPY . .")
    first_install = next(i for i, line in enumerate(lines) if line.startswith("RUN") and "pip install -e" in line)
    assert first_install < copy_all and any(
        line.startswith("COPY") and "pyproject.toml" in line for line in lines[:first_install])
    assert all("--no-deps" in line for line in lines[copy_all:] if "pip install" in line)


def test_torch_is_pinned_to_the_base_images_and_the_user_is_not_root():
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(_instruction("ENV"))))
    constraints = env["PIP_CONSTRAINT"]
    # The constraint file is written from the image's own torch before anything else is installed.
    assert any(constraints in run and "torch.__version__" in run for run in _instruction("RUN"))
    (user,) = _instruction("USER")
    assert user.strip() not in ("root", "0")
    assert any("useradd" in run and user.strip() in run for run in _instruction("RUN"))


def test_the_image_turns_a_preemptions_sigterm_into_awaiting_retry():
    """Vertex's worker sets no SIGTERM behaviour: without it `prefect flow-run
    execute` dies at once and the trainer never checkpoints."""
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(_instruction("ENV"))))
    assert env["PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR"] == "reschedule"
