"""The Kubernetes objects of a multi-node training run, from the template in
deployments/multinode/training-job.yaml: a ConfigMap (the trainer's config),
a headless Service (pod 0's rendezvous address) and an indexed Job (pod i is
node i).

Rendering is a plain substitution (see the template's header); every
rendered object is then read back through the Kubernetes client's own models
and must come out unchanged, so a misspelt or misplaced field fails here, not
as an object the API server silently trims.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.root import layout

TEMPLATE = Path(__file__).resolve().parents[2] / "deployments" / "multinode" / "training-job.yaml"
RDZV_PORT = 29500
FINISHED_TTL_S = 3600
"""A finished Job is normally deleted by the flow once it has read the nodes'
records (under the root); this removes one the flow never came back to (its
pod failed, and a failed pod is not deleted, so its dependents stay)."""
KINDS = {"ConfigMap": "V1ConfigMap", "Service": "V1Service", "Job": "V1Job"}
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# The single-node pod's environment, minus what belongs to its own flow run.
_NOT_COPIED_ENV = ("PREFECT__FLOW_RUN_ID", "PREFECT__", "HOSTNAME")


class TemplateError(UserError):
    """The multi-node template renders objects Kubernetes would not accept as written."""


def job_name(config: Config, flow_run_id: str | None) -> str:
    """A DNS label naming the Job, its Service and ConfigMap: the same for a
    rescheduled attempt of one flow run (so it finds the Job it started), and
    short enough for the pods' `NAME-INDEX` hostnames."""
    digest = hashlib.sha256(f"{layout.run_name(config)}/{flow_run_id or 'local'}".encode()).hexdigest()
    return f"gpt2-train-{digest[:12]}"


def rdzv_endpoint(name: str, port: int = RDZV_PORT) -> str:
    """Pod 0's address through the headless Service (`subdomain` of every pod)."""
    return f"{name}-0.{name}:{port}"


def _copied_env(env: list[dict] | None) -> list[dict]:
    return [e for e in env or [] if not e["name"].startswith(_NOT_COPIED_ENV)]


def _resources(source: dict, gpus: int) -> dict:
    """The source container's requests and limits, with `gpus` GPUs."""
    limits = {**(source.get("limits") or {}), "nvidia.com/gpu": gpus}
    return {k: v for k, v in {"limits": limits, "requests": source.get("requests")}.items() if v}


def values(config: Config, name: str, namespace: str, pod: dict, nproc: int, parent_run_id: str | None,
           tags: dict | None, active_deadline_seconds: int | None = None) -> dict[str, Any]:
    """The template's values: `pod` is the flow's own pod (a dict in the API's
    camelCase), whose image, environment, secrets, scheduling and grace period
    every node gets; its config is `config` with the rendezvous at pod 0.
    `active_deadline_seconds`: the flow's own Job's (the pool's maximum run
    time per attempt), None for none."""
    spec = pod["spec"]
    container = spec["containers"][0]
    runtime = config.runtime.model_copy(update={"rdzv_endpoint": rdzv_endpoint(name), "nproc_per_node": nproc})
    trainer_config = config.model_copy(update={"runtime": runtime})
    return {
        "name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "gpt2-train", "gpt2/job": name},
        "nnodes": config.runtime.nnodes, "gpu_count": nproc, "rdzv_port": RDZV_PORT,
        "image": container["image"], "image_pull_policy": container.get("imagePullPolicy"),
        "service_account_name": spec.get("serviceAccountName"),
        "env": _copied_env(container.get("env")), "env_from": container.get("envFrom"),
        "node_selector": node_selector(config, spec.get("nodeSelector")), "tolerations": spec.get("tolerations"),
        "resources": _resources(container.get("resources") or {}, nproc),
        "termination_grace_period_seconds": spec.get("terminationGracePeriodSeconds"),
        "run_json": json.dumps(trainer_config.model_dump(mode="json")),
        "launch_json": json.dumps({"parent_run_id": parent_run_id, "tags": tags or {}}),
        "owner_references": owned_by(pod),
        "active_deadline_seconds": active_deadline_seconds, "finished_ttl_seconds": FINISHED_TTL_S,
        "work_dir_size": _work_dir_size(spec),
    }


GPU_LABEL = "cloud.google.com/gke-accelerator"


def node_selector(config: Config, flow_selector: dict | None) -> dict | None:
    """The training pods' node selector: the flow pod's (Spot, its pool's
    labels), with the GPU of runtime.node_gpu_type when it names one."""
    gpu = config.runtime.node_gpu_type
    return {**(flow_selector or {}), GPU_LABEL: gpu} if gpu else flow_selector


def _work_dir_size(spec: dict) -> str | None:
    """The size limit of the flow pod's work-dir emptyDir (the pool's work_dir_size)."""
    work = next((v for v in spec.get("volumes") or [] if v.get("name") == "work"), None)
    return ((work or {}).get("emptyDir") or {}).get("sizeLimit")


def owned_by(pod: dict) -> list[dict] | None:
    """The flow's pod as the owner (None for a pod description without a uid)."""
    meta = pod.get("metadata") or {}
    if not meta.get("uid"):
        return None
    return [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}]


def _substitute(node: Any, vals: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        out = {k: _substitute(v, vals) for k, v in node.items()}
        return {k: v for k, v in out.items() if v is not None}
    if isinstance(node, list):
        return [_substitute(v, vals) for v in node]
    if isinstance(node, str):
        whole = _PLACEHOLDER.fullmatch(node.strip())
        if whole:
            return vals[whole[1]]
        return _PLACEHOLDER.sub(lambda m: str(vals[m[1]]), node)
    return node


def render(vals: dict[str, Any], template: Path = TEMPLATE) -> list[dict]:
    """The template's objects with `vals` filled in, validated (see validate)."""
    docs = [d for d in yaml.safe_load_all(template.read_text()) if d]
    missing = sorted({m for d in docs for m in _PLACEHOLDER.findall(json.dumps(d))} - vals.keys())
    if missing:
        raise TemplateError(f"{template} uses {', '.join(missing)}, which the training flow does not provide")
    objects = [_substitute(d, vals) for d in docs]
    validate(objects)
    return objects


async def _round_trip(objects: list[dict]) -> list[tuple[dict, Any]]:
    from kubernetes_asyncio.client import ApiClient

    class _Body:  # what ApiClient.deserialize reads from a response
        def __init__(self, obj: dict):
            self.data = json.dumps(obj)

    async with ApiClient() as api:
        out = []
        for obj in objects:
            kind = KINDS.get(obj.get("kind"))
            if kind is None:
                raise TemplateError(f"the multi-node template holds a {obj.get('kind')!r}; only "
                                    f"{', '.join(KINDS)} are created")
            try:
                model = api.deserialize(_Body(obj), kind)
            except ValueError as err:
                raise TemplateError(f"{obj['kind']} {obj.get('metadata', {}).get('name')}: {err}") from None
            out.append((api.sanitize_for_serialization(model), model))
        return out


def models(objects: list[dict]) -> list[Any]:
    """The objects as the Kubernetes client's models (V1ConfigMap, V1Service, V1Job)."""
    return [model for _, model in asyncio.run(_round_trip(objects))]


def validate(objects: list[dict]) -> None:
    """Every object must survive the client's models unchanged: a field the
    models do not know (misspelt, misplaced) would otherwise vanish."""
    for obj, (back, _) in zip(objects, asyncio.run(_round_trip(objects))):
        lost = _differences(obj, back)
        if lost:
            raise TemplateError(f"{obj['kind']} {obj['metadata'].get('name')}: Kubernetes does not take "
                                f"{', '.join(lost)} as written; fix {TEMPLATE.name}")


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a for d in _differences(a[k], b.get(k), f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b or str(a) == str(b) else [path]
