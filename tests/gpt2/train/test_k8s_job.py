"""The multi-node Kubernetes Job, as far as it runs without a cluster: the
template rendered and read back through the Kubernetes client's own models,
checked against what the pods need; Job states read from real V1Job objects;
the pods' own command run as two local "pods" whose records give the result."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpt2.config.tree import Config
from gpt2.launch import k8s_status, k8s_template, multinode
from gpt2.launch.k8s_status import NodeLost, job_state, outcome
from gpt2.train.run import Preempted
from gpt2.train.session import TrainingError
from tests.gpt2.train.fixtures import tiny_config, write_dataset
from tests.tiers import scenario

REPO = Path(__file__).resolve().parents[3]
POOL = json.loads((REPO / "deployments" / "pools" / "kubernetes-gpu.json").read_text())

# The flow's own pod as the GPU pool's template makes it (API camelCase), with a Secret added
# the way deployments/README.md says.
FLOW_POD = {"metadata": {"name": "gpt2-train-flow-abcde", "uid": "6f1e1c2a-0000-4000-8000-000000000001"}, "spec": {
    **{k: v for k, v in POOL["job_configuration"]["job_manifest"]["spec"]["template"]["spec"].items()
       if k in ("nodeSelector", "tolerations", "restartPolicy")},
    "serviceAccountName": "gpt2-trainer",
    "terminationGracePeriodSeconds": POOL["variables"]["properties"]["termination_grace_period_seconds"]["default"],
    "containers": [{
        "name": "prefect-job", "image": "europe-docker.pkg.dev/p/gpt2/gpt2-pipeline:1", "imagePullPolicy": "Always",
        "env": [{"name": "PREFECT__FLOW_RUN_ID", "value": "0b1c"}, {"name": "HF_HOME", "value": "/cache/hf"}],
        "envFrom": [{"secretRef": {"name": "gpt2-credentials"}}],
        "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "200Gi"}, "requests": {"cpu": "40"}},
    }],
}}


def _render(tmp_path, nnodes: int = 4, nproc: int = 8):
    config = tiny_config("gs://bucket/runs", **{"runtime.nnodes": nnodes, "runtime.work_dir": str(tmp_path)})
    name = k8s_template.job_name(config, "flow-run-1")
    vals = k8s_template.values(config, name, "training", FLOW_POD, nproc, "mlflow-parent", {"stage": "train"})
    return config, name, {o["kind"]: o for o in k8s_template.render(vals)}


def test_every_object_is_what_kubernetes_takes_and_what_the_pods_need(tmp_path):
    config, name, objs = _render(tmp_path)
    assert list(objs) == ["ConfigMap", "Service", "Job"]
    models = k8s_template.models(list(objs.values()))
    assert [type(m).__name__ for m in models] == ["V1ConfigMap", "V1Service", "V1Job"]
    cm, svc, job = models
    # Pod hostnames NAME-INDEX are DNS labels; the name is stable for a rescheduled flow run.
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(f"{name}-999") <= 63
    assert name == k8s_template.job_name(config, "flow-run-1") != k8s_template.job_name(config, "flow-run-2")

    # Owned by the flow's pod: deleting it (a cancelled flow run, a reclaimed machine) deletes them all.
    for m in models:
        [owner] = m.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid) == ("Pod", FLOW_POD["metadata"]["name"], FLOW_POD["metadata"]["uid"])
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    assert svc.spec.selector == {"job-name": name} and svc.spec.ports[0].port == k8s_template.RDZV_PORT
    spec = job.spec
    assert spec.completion_mode == "Indexed" and spec.completions == spec.parallelism == 4
    assert spec.backoff_limit == 0
    pod = spec.template.spec
    assert pod.subdomain == svc.metadata.name == name and pod.restart_policy == "Never"
    assert pod.termination_grace_period_seconds == 120  # the single-node template's
    assert pod.service_account_name == "gpt2-trainer"
    assert pod.node_selector == FLOW_POD["spec"]["nodeSelector"]
    assert [t.key for t in pod.tolerations] == [t["key"] for t in FLOW_POD["spec"]["tolerations"]]
    [c] = pod.containers
    assert c.image == FLOW_POD["spec"]["containers"][0]["image"] and c.image_pull_policy == "Always"
    assert c.command == ["/usr/bin/tini", "--"] and c.args[:3] == ["python", "-m", "gpt2.launch.node"]
    assert {e.name: e.value for e in c.env} == {"HF_HOME": "/cache/hf"}  # not the flow run's own id
    assert c.env_from[0].secret_ref.name == "gpt2-credentials"
    assert c.resources.limits == {"nvidia.com/gpu": "8", "memory": "200Gi"} and c.resources.requests == {"cpu": "40"}
    assert c.ports[0].container_port == k8s_template.RDZV_PORT

    # The config the pods read: where the ConfigMap is mounted, rendezvous at pod 0 through the Service.
    mount = next(m for m in c.volume_mounts if m.name == "config")
    assert next(v for v in pod.volumes if v.name == "config").config_map.name == cm.metadata.name
    arg = dict(zip(c.args[3::2], c.args[4::2]))
    assert Path(arg["--config"]).parent == Path(mount.mount_path) == Path(arg["--launch"]).parent
    assert arg["--job"] == name
    trainer = Config.model_validate(json.loads(cm.data[Path(arg["--config"]).name]))
    assert trainer.runtime.nnodes == 4 and trainer.runtime.nproc_per_node == 8
    assert trainer.runtime.rdzv_endpoint == f"{name}-0.{name}:{k8s_template.RDZV_PORT}"
    host, port = multinode.parse_endpoint(trainer.runtime.rdzv_endpoint)
    assert host.split(".") == [f"{name}-0", svc.metadata.name] and port == svc.spec.ports[0].port
    assert multinode.rdzv_id(trainer) == multinode.rdzv_id(config)  # the same run
    assert json.loads(cm.data[Path(arg["--launch"]).name]) == {"parent_run_id": "mlflow-parent",
                                                               "tags": {"stage": "train"}}


def test_the_nodes_job_is_bounded_in_time_and_disk_like_the_flows_pod(tmp_path):
    config = tiny_config("gs://bucket/runs", **{"runtime.nnodes": 2, "runtime.work_dir": str(tmp_path)})
    name = k8s_template.job_name(config, "flow-run-1")
    size = POOL["variables"]["properties"]["work_dir_size"]["default"]
    deadline = POOL["variables"]["properties"]["active_deadline_seconds"]["default"]
    pod = {**FLOW_POD, "spec": {**FLOW_POD["spec"], "volumes": [{"name": "work", "emptyDir": {"sizeLimit": size}}]}}
    vals = k8s_template.values(config, name, "training", pod, 8, None, None, active_deadline_seconds=deadline)
    job = k8s_template.models(k8s_template.render(vals))[-1]
    assert job.spec.active_deadline_seconds == deadline
    assert job.spec.ttl_seconds_after_finished == k8s_template.FINISHED_TTL_S
    work = next(v for v in job.spec.template.spec.volumes if v.name == "work")
    assert work.empty_dir.size_limit == size
    # Without a deadline or a work-dir limit on the flow's pod, none is invented.
    bare = k8s_template.models(k8s_template.render(k8s_template.values(config, name, "training", FLOW_POD, 8,
                                                                       None, None)))[-1]
    assert bare.spec.active_deadline_seconds is None
    assert next(v for v in bare.spec.template.spec.volumes if v.name == "work").empty_dir.size_limit is None


def test_training_pods_get_their_own_gpu_and_a_coordinating_pod_needs_none(tmp_path):
    from prefect.utilities.schema_tools import validate

    from gpt2.errors import UserError
    from gpt2.launch import k8s_run

    gpu = "nvidia-h100-80gb"
    assert gpu != FLOW_POD["spec"]["nodeSelector"][k8s_template.GPU_LABEL]
    config = tiny_config("gs://bucket/runs", **{"runtime.nnodes": 2, "runtime.work_dir": str(tmp_path),
                                                "runtime.node_gpu_type": gpu, "runtime.nproc_per_node": 8})
    name = k8s_template.job_name(config, "flow-run-1")
    job = k8s_template.models(k8s_template.render(
        k8s_template.values(config, name, "training", FLOW_POD, 8, None, None)))[-1]
    # The flow pod's other labels (Spot) stay; the GPU is the nodes' own.
    assert job.spec.template.spec.node_selector == {**FLOW_POD["spec"]["nodeSelector"], k8s_template.GPU_LABEL: gpu}
    # The pool lets the coordinating pod take no GPU; then the nodes' GPU count must be given.
    validate({"image": "registry.example/gpt2:1", "gpu_count": 0}, POOL["variables"], raise_on_error=True)
    k8s_run.check_node_gpus(config, 0)
    auto = tiny_config("gs://bucket/runs", **{"runtime.nnodes": 2, "runtime.work_dir": str(tmp_path)})
    with pytest.raises(UserError, match="runtime.nproc_per_node"):
        k8s_run.check_node_gpus(auto, 0)
    k8s_run.check_node_gpus(auto, 1)


def test_a_field_kubernetes_does_not_know_or_a_missing_value_is_refused(tmp_path):
    text = k8s_template.TEMPLATE.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("completionMode: Indexed", "completionsMode: Indexed"))
    _, name, _ = _render(tmp_path)
    vals = k8s_template.values(tiny_config("gs://b/r", **{"runtime.nnodes": 2}), name, "ns", FLOW_POD, 1, None, None)
    with pytest.raises(k8s_template.TemplateError, match=r"Job .*spec\.completionsMode"):
        k8s_template.render(vals, bad)
    bad.write_text(text.replace("{{ image }}", "{{ trainer_image }}"))
    with pytest.raises(k8s_template.TemplateError, match="trainer_image"):
        k8s_template.render(vals, bad)


def _job(status: dict):
    obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}, "status": status}
    return k8s_template.models([obj])[0]


def _cond(kind: str, reason: str = "") -> dict:
    return {"type": kind, "status": "True", "reason": reason}


def test_job_states_from_real_v1job_objects():
    running = job_state(_job({"active": 2}))
    assert not running.final and "2 pod(s) active" in running.reason
    # A pod was evicted: Kubernetes marks the Job failing while the others still write their checkpoint.
    failing = job_state(_job({"active": 0, "failed": 1, "terminating": 1,
                              "conditions": [_cond("FailureTarget", "BackoffLimitExceeded")]}))
    assert not failing.final and "1 pod(s) terminating" in failing.reason
    failed = job_state(_job({"failed": 2, "terminating": 0, "conditions": [
        _cond("FailureTarget", "BackoffLimitExceeded"), _cond("Failed", "BackoffLimitExceeded")]}))
    assert failed.final and not failed.succeeded and failed.reason == "Failed: BackoffLimitExceeded"
    done = job_state(_job({"succeeded": 2, "conditions": [_cond("SuccessCriteriaMet"), _cond("Complete")]}))
    assert done.final and done.succeeded
    # A condition that is over ("False") does not count.
    assert not job_state(_job({"active": 1, "conditions": [{"type": "Failed", "status": "False"}]})).final


RESULT = {"run_name": "r", "checkpoint": None, "steps": 8, "resumed_from_step": 0, "final_train_loss": 1.0,
          "final_val_loss": 1.5, "tokens_per_second": 10.0, "mlflow_run_id": None, "micro_batch_size": 4,
          "world_size": 2}


def test_node_records_map_to_the_launchers_outcomes():
    state = k8s_status.JobState(True, False, "Failed: BackoffLimitExceeded")
    main = {**RESULT, "checkpoint": "gs://b/ckpt/step_000008"}
    done = [{"event": "done", "result": RESULT}, {"event": "done", "result": main}]
    assert outcome("j", k8s_status.JobState(True, True, "Complete"), done).checkpoint == main["checkpoint"]
    stopped = {"event": "preempted", "message": "stopped by SIGTERM after step 5; checkpoint c"}
    with pytest.raises(Preempted, match="after step 5"):
        outcome("j", state, [stopped, stopped])
    with pytest.raises(TrainingError, match="node 1: NaN loss"):
        outcome("j", state, [stopped, {"event": "error", "message": "NaN loss"}])
    with pytest.raises(NodeLost, match=r"node\(s\) 1 of training Job j .*BackoffLimitExceeded"):
        outcome("j", state, [{"event": "done", "result": RESULT}, None])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@scenario
def test_the_pods_command_trains_as_two_local_pods_and_their_records_give_the_result(tmp_path):
    config = tiny_config(tmp_path, **{"runtime.nnodes": 2, "train.max_steps": 4})
    write_dataset(config)
    name = k8s_template.job_name(config, "flow-run-1")
    objs = {o["kind"]: o for o in k8s_template.render(
        k8s_template.values(config, name, "ns", FLOW_POD, 1, None, {"stage": "train"}))}
    container = objs["Job"]["spec"]["template"]["spec"]["containers"][0]
    # No cluster DNS here: pod 0's address becomes loopback; everything else is what the pods get.
    run = json.loads(objs["ConfigMap"]["data"]["run.json"])
    run["runtime"]["rdzv_endpoint"] = f"127.0.0.1:{_free_port()}"
    mount = tmp_path / "etc-gpt2"
    mount.mkdir()
    (mount / "run.json").write_text(json.dumps(run))
    (mount / "launch.json").write_text(objs["ConfigMap"]["data"]["launch.json"])
    args = [a.replace("/etc/gpt2", str(mount)) for a in container["args"]]
    assert args[0] == "python"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    pods = [subprocess.Popen([sys.executable, *args[1:]], cwd=REPO, env={**env, "JOB_COMPLETION_INDEX": str(i)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    logs: list[list[str]] = [[], []]
    readers = [threading.Thread(target=lambda p=p, out=out: out.extend(p.stdout), daemon=True)
               for p, out in zip(pods, logs)]
    for r in readers:
        r.start()
    codes = [p.wait(timeout=300) for p in pods]
    assert codes == [0, 0], "".join(logs[0][-30:] + logs[1][-30:])
    records = k8s_status.read_outcomes(config, name)
    assert [r["node"] for r in records] == [0, 1]
    result = outcome(name, k8s_status.JobState(True, True, "Complete"), records)
    assert result.world_size == 2 and result.steps == 4 and result.checkpoint.endswith("step_000004")
    k8s_status.clear_outcomes(config, name)
    assert k8s_status.read_outcomes(config, name) == [None, None]


def test_the_role_grants_every_call_the_flow_makes():
    import yaml

    from gpt2.launch import k8s_run

    rbac = list(yaml.safe_load_all((REPO / "deployments" / "multinode" / "rbac.yaml").read_text()))
    [role] = [d for d in rbac if d["kind"] == "Role"]
    [binding] = [d for d in rbac if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    plural = {"pod": "pods", "job": "jobs", "job_status": "jobs/status", "service": "services",
              "config_map": "configmaps"}
    verb = {"read": "get", "create": "create", "delete": "delete", "patch": "patch"}
    calls = set(re.findall(r"\b(read|create|delete|patch)_namespaced_(\w+)", Path(k8s_run.__file__).read_text()))
    # the pod read; jobs read (status), created, deleted, patched (owner); services, configmaps too
    assert len(calls) == 11
    assert {(plural[r], verb[v]) for v, r in calls} <= granted


def test_the_image_has_the_kubernetes_client_the_flow_pod_uses():
    from importlib.metadata import requires

    assert 'pip install -e ".[kubernetes]"' in (REPO / "deployments" / "Dockerfile").read_text()
    # The extra is prefect-kubernetes, which brings the client k8s_run and k8s_template import.
    assert any(r.startswith("kubernetes-asyncio") or r.startswith("kubernetes_asyncio")
               for r in requires("prefect-kubernetes"))
