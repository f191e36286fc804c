"""Base job templates in deployments/pools/: accepted by a real Prefect server
and rendered by each worker type's own job configuration into the job it
would submit (Kubernetes and Vertex AI through prefect-kubernetes / prefect-gcp)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import FlowRun
from prefect.settings import Settings
from prefect.utilities.schema_tools import ValidationError, validate
from prefect.workers.process import ProcessJobConfiguration, ProcessWorker

from flows import deployment_file

TEMPLATES = {"process-cpu": "process", "process-gpu": "process", "kubernetes-gpu": "kubernetes",
             "vertex-gpu": "vertex-ai"}
HEARTBEAT = {deployment_file.HEARTBEAT_ENV: str(deployment_file.GPU_HEARTBEAT_S)}


def _render(config_cls, template: dict, values: dict):
    config = asyncio.run(config_cls.from_template_and_values(template, values))
    config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="gentle-gpt"))
    return config


@pytest.mark.parametrize("name,pool_type", TEMPLATES.items())
def test_server_accepts_template(prefect_server, name, pool_type):
    pool = f"test-{name}-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type=pool_type,
                                               base_job_template=deployment_file.pool_template(name)))
        try:
            stored = client.read_work_pool(pool).base_job_template
        finally:
            client.delete_work_pool(pool)
    assert stored == deployment_file.pool_template(name)


def test_server_rejects_a_template_with_an_undeclared_variable(prefect_server):
    # The same check the templates above pass: a placeholder needs a variable.
    bad = deployment_file.pool_template("process-gpu")
    del bad["variables"]["properties"]["working_dir"]
    with pytest.raises(Exception, match="working_dir"):
        with get_client(sync_client=True) as client:
            client.create_work_pool(WorkPoolCreate(name="test-bad", type="process", base_job_template=bad))


def test_process_templates_have_the_process_worker_shape(prefect_server):
    default = ProcessWorker.get_default_base_job_template()
    assert deployment_file.pool_template("process-cpu") == default
    gpu = deployment_file.pool_template("process-gpu")
    assert gpu["job_configuration"] == default["job_configuration"]
    assert set(gpu["variables"]["properties"]) == set(default["variables"]["properties"])
    assert _render(ProcessJobConfiguration, gpu, {}).env.items() >= HEARTBEAT.items()
    assert deployment_file.HEARTBEAT_ENV not in _render(ProcessJobConfiguration, default, {}).env


def test_heartbeat_variable_is_the_setting_prefect_reads(monkeypatch):
    monkeypatch.setenv(deployment_file.HEARTBEAT_ENV, "30")
    assert Settings().flows.heartbeat_frequency == 30


def test_kubernetes_job_is_a_spot_gpu_job_never_retried_by_kubernetes(prefect_server):
    worker = pytest.importorskip("prefect_kubernetes.worker")

    config = _render(worker.KubernetesWorkerJobConfiguration, deployment_file.pool_template("kubernetes-gpu"),
                     {"image": "registry.example/gpt2:1", "gpu_count": 4})
    spec = config.job_manifest["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert spec["backoffLimit"] == 0
    assert container["image"] == "registry.example/gpt2:1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert {t["key"] for t in pod["tolerations"]} == {"nvidia.com/gpu", "cloud.google.com/gke-spot"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env.items() >= HEARTBEAT.items()
    # backoffLimit 0 is what makes the worker tell the run to reschedule itself on SIGTERM (eviction).
    assert env["PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR"] == "reschedule"
    # Room for the SIGTERM checkpoint on a drain; the image's ENTRYPOINT (tini) stays: the command is args.
    assert pod["terminationGracePeriodSeconds"] == 120
    assert "command" not in container and container["args"] == ["prefect", "flow-run", "execute"]


def test_kubernetes_template_requires_an_image():
    # The image built from deployments/Dockerfile: Prefect's stock image lacks our code.
    variables = deployment_file.pool_template("kubernetes-gpu")["variables"]
    with pytest.raises(ValidationError, match="image"):
        validate({}, variables, raise_on_error=True)
    validate({"image": "registry.example/gpt2:1"}, variables, raise_on_error=True)


def _service_account(tmp_path) -> str:
    """A syntactically real service-account key (fresh RSA key, fake project) so
    google-auth builds credentials offline; nothing is ever sent with it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = tmp_path / "sa.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "demo-project", "private_key_id": "k1", "private_key": pem,
        "client_email": "gpt2@demo-project.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token"}))
    return str(path)


def test_vertex_job_is_a_spot_accelerator_job_never_retried_by_vertex(prefect_server, tmp_path, monkeypatch):
    vertex = pytest.importorskip("prefect_gcp.workers.vertex")

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", _service_account(tmp_path))
    config = _render(vertex.VertexAIWorkerJobConfiguration, deployment_file.pool_template("vertex-gpu"),
                     {"image": "registry.example/gpt2:1", "region": "us-central1", "accelerator_count": 2})
    pool_spec = config.job_spec["worker_pool_specs"][0]
    assert pool_spec["machine_spec"] == {"accelerator_type": "NVIDIA_L4", "accelerator_count": 2,
                                         "machine_type": "g2-standard-12"}
    assert pool_spec["container_spec"]["image_uri"] == "registry.example/gpt2:1"
    assert config.job_spec["scheduling"] == {"strategy": "SPOT", "disable_retries": True}
    # Vertex's command replaces the ENTRYPOINT, so tini (SIGTERM to Python) is named in it.
    assert pool_spec["container_spec"]["command"] == ["/usr/bin/tini", "--", "prefect", "flow-run", "execute"]
    assert config.env.items() >= HEARTBEAT.items()


# What a user gives a GPU pool when they keep every default: only the required variables.
K8S_REQUIRED = {"image": "registry.example/gpt2:1"}
VERTEX_REQUIRED = {"image": "registry.example/gpt2:1", "region": "us-central1",
                   "service_account_name": "gpt2-train@demo-project.iam.gserviceaccount.com"}


def _defaults(name: str) -> dict:
    return {k: v.get("default") for k, v in deployment_file.pool_template(name)["variables"]["properties"].items()}


def test_kubernetes_job_with_the_defaults_is_what_the_api_takes(prefect_server):
    """The manifest prefect-kubernetes hands to create_namespaced_job, read back
    through the Kubernetes client's own V1Job: nothing trimmed, every env value
    a string, requests set (never a BestEffort pod), a bounded attempt, and a
    size-limited work dir that the scheduler reserves disk for."""
    worker = pytest.importorskip("prefect_kubernetes.worker")
    from gpt2.launch import k8s_template
    from gpt2.process import kill_window as preemption

    config = _render(worker.KubernetesWorkerJobConfiguration, deployment_file.pool_template("kubernetes-gpu"),
                     K8S_REQUIRED)
    k8s_template.validate([config.job_manifest])
    defaults, spec = _defaults("kubernetes-gpu"), config.job_manifest["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert all(isinstance(e["value"], str) for e in container["env"])
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[preemption.POOL_ENV] == defaults["pool_kind"] and env.items() >= HEARTBEAT.items()
    assert spec["activeDeadlineSeconds"] == defaults["active_deadline_seconds"]
    requests = container["resources"]["requests"]
    assert requests == {"cpu": defaults["cpu_request"], "memory": defaults["memory_request"],
                        "ephemeral-storage": defaults["work_dir_size"]}
    (work,) = [v for v in pod["volumes"] if v["name"] == "work"]
    assert work["emptyDir"]["sizeLimit"] == defaults["work_dir_size"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "work"]
    assert mount["mountPath"].endswith("/.cache")  # runtime.work_dir's default (~/.cache/gpt2-pipeline) is in it


KUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def test_kubernetes_job_joins_a_kueue_queue_only_when_one_is_named(prefect_server):
    """#44: kueue_queue puts Kueue's queue label on the Job (Kueue suspends it
    until its ClusterQueue admits it); unset, the label is not there at all
    (Prefect's templating drops a placeholder without a value), and the
    labels job variable still reaches the Job either way."""
    worker = pytest.importorskip("prefect_kubernetes.worker")
    from gpt2.launch import k8s_template

    template = deployment_file.pool_template("kubernetes-gpu")
    queued = _render(worker.KubernetesWorkerJobConfiguration, template,
                     {**K8S_REQUIRED, "kueue_queue": "team-a-gpu", "labels": {"team": "a"}})
    k8s_template.validate([queued.job_manifest])
    labels = queued.job_manifest["metadata"]["labels"]
    assert labels[KUEUE_LABEL] == "team-a-gpu" and labels["team"] == "a"
    # Kueue admits the Job; a pod carrying the label too would be a second workload to Kueue's pod integration.
    assert KUEUE_LABEL not in queued.job_manifest["spec"]["template"]["metadata"]["labels"]
    plain = _render(worker.KubernetesWorkerJobConfiguration, template, K8S_REQUIRED)
    assert KUEUE_LABEL not in plain.job_manifest["metadata"]["labels"]
    assert "prefect.io/flow-run-name" in plain.job_manifest["metadata"]["labels"]  # Prefect's own labels stay


def test_kueue_queue_must_be_a_kubernetes_name():
    variables = deployment_file.pool_template("kubernetes-gpu")["variables"]
    for bad in ("Team A", "-gpu", "q" * 64):
        with pytest.raises(ValidationError, match="kueue_queue"):
            validate({**K8S_REQUIRED, "kueue_queue": bad}, variables, raise_on_error=True)
    validate({**K8S_REQUIRED, "kueue_queue": "team-a.gpu"}, variables, raise_on_error=True)


def test_kubernetes_pod_watch_outlasts_the_stages_own_wait_to_start(prefect_server):
    """A Job Kueue holds suspended (or waiting for a Spot node) has no pod yet:
    the worker's pod watch must not give the run up before the stage's own
    wait (runtime.stage_start_timeout_s; the ladder's start_timeout_s is shorter)."""
    worker = pytest.importorskip("prefect_kubernetes.worker")
    from gpt2.config.runtime import RuntimeConfig

    config = _render(worker.KubernetesWorkerJobConfiguration, deployment_file.pool_template("kubernetes-gpu"),
                     K8S_REQUIRED)
    assert config.pod_watch_timeout_seconds == _defaults("kubernetes-gpu")["pod_watch_timeout_seconds"]
    assert config.pod_watch_timeout_seconds >= RuntimeConfig.model_fields["stage_start_timeout_s"].default
    assert config.pod_watch_timeout_seconds > worker.KubernetesWorkerJobConfiguration.model_fields[
        "pod_watch_timeout_seconds"].default  # prefect-kubernetes' own 60 s is what it replaces


def test_vertex_job_with_the_defaults_builds_through_the_workers_own_code(prefect_server, tmp_path, monkeypatch):
    """The CustomJobSpec the Vertex worker would submit (its own _build_job_spec,
    google-cloud-aiplatform's types): the run-as service account, SPOT without
    Vertex's retries, a timeout above a one-L4 gpt2-124m run, and the SIGTERM
    behaviour that lets the trainer checkpoint."""
    vertex = pytest.importorskip("prefect_gcp.workers.vertex")
    pytest.importorskip("google.cloud.aiplatform", reason="the vertex extra brings it")
    from gpt2.process import kill_window as preemption

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", _service_account(tmp_path))
    config = _render(vertex.VertexAIWorkerJobConfiguration, deployment_file.pool_template("vertex-gpu"),
                     VERTEX_REQUIRED)
    job = vertex.VertexAIWorker(work_pool_name="gpu")._build_job_spec(config)
    defaults = _defaults("vertex-gpu")
    assert job.service_account == VERTEX_REQUIRED["service_account_name"]
    assert job.scheduling.strategy == vertex.Scheduling.Strategy.SPOT and job.scheduling.disable_retries
    assert job.scheduling.timeout.total_seconds() == defaults["maximum_run_time_hours"] * 3600
    (pool,) = job.worker_pool_specs
    env = {e.name: e.value for e in pool.container_spec.env}
    assert env["PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR"] == "reschedule"
    assert env[preemption.POOL_ENV] == "vertex" and env.items() >= HEARTBEAT.items()
    assert pool.machine_spec.accelerator_count == defaults["accelerator_count"]


def test_vertex_pool_refuses_a_run_without_a_service_account_before_submitting_it(prefect_server):
    """The server checks a flow run's job variables against the pool's schema
    when the run is created, so a missing service account is an error at
    `prefect deployment run`, not a Crashed run on the worker."""
    pool = f"test-vertex-{uuid.uuid4().hex[:6]}"
    without = {k: v for k, v in VERTEX_REQUIRED.items() if k != "service_account_name"}
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="vertex-ai",
                                               base_job_template=deployment_file.pool_template("vertex-gpu")))
        try:
            flow_id = client.create_flow_from_name(f"flow-{pool}")
            deployment = client.create_deployment(flow_id, "train", work_pool_name=pool, job_variables=without)
            with pytest.raises(Exception, match="service_account_name"):
                client.create_flow_run_from_deployment(deployment)
            run = client.create_flow_run_from_deployment(
                deployment, job_variables={"service_account_name": VERTEX_REQUIRED["service_account_name"]})
            assert run.job_variables["service_account_name"] == VERTEX_REQUIRED["service_account_name"]
        finally:
            client.delete_work_pool(pool)


@pytest.mark.parametrize("name,pool_type", [("kubernetes-gpu", "kubernetes"), ("vertex-gpu", "vertex-ai")])
def test_a_container_pool_refuses_a_deployment_without_a_real_image(prefect_server, name, pool_type):
    """`prefect deploy` without $GPT2_IMAGE gives the GPU deployments an empty
    image: refused when the deployment is created, not a pod of the wrong image."""
    pool = f"test-{name}-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type=pool_type,
                                               base_job_template=deployment_file.pool_template(name)))
        try:
            flow_id = client.create_flow_from_name(f"flow-{pool}")
            for bad in ("", "{{ $GPT2_IMAGE }}"):
                with pytest.raises(Exception, match="image"):
                    client.create_deployment(flow_id, "train", work_pool_name=pool, job_variables={"image": bad})
            client.create_deployment(flow_id, "train", work_pool_name=pool, job_variables=K8S_REQUIRED)
        finally:
            client.delete_work_pool(pool)
