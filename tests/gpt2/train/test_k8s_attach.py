"""The training flow's calls on a multi-node Job it re-attaches to, made by the
real Kubernetes client (kubernetes_asyncio) over HTTP to a loopback stand-in
for the API server that answers the few endpoints involved: the re-attaching
attempt's pod becomes the objects' only owner (a JSON patch), and a Job that
vanishes while it is watched is a lost node, not an error."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from gpt2.launch import k8s_run, k8s_status
from gpt2.launch.k8s_status import NodeLost
from tests.gpt2.train.test_k8s_job import FLOW_POD

NS, NAME = "training", "gpt2-train-abc"
NEW_POD = {**FLOW_POD, "metadata": {"name": "gpt2-train-flow-fghij", "uid": "6f1e1c2a-0000-4000-8000-000000000002"}}
RUNNING = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": NAME, "namespace": NS},
           "spec": {"template": {"spec": {"containers": []}}}, "status": {"active": 2}}


class ApiServer:
    """Jobs by name (None: deleted) and every PATCH received."""

    def __init__(self):
        self.jobs: dict[str, dict | None] = {NAME: RUNNING}
        self.patches: list[tuple[str, str, object]] = []

    async def job_status(self, request):
        job = self.jobs.get(request.match_info["name"])
        if job is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        return web.json_response(job)

    async def patch(self, request):
        self.patches.append((request.path, request.content_type, json.loads(await request.text())))
        return web.json_response({"metadata": {"name": request.match_info["name"]}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/apis/batch/v1/namespaces/{ns}/jobs/{name}/status", self.job_status)
        for path in ("/apis/batch/v1/namespaces/{ns}/jobs/{name}", "/api/v1/namespaces/{ns}/services/{name}",
                     "/api/v1/namespaces/{ns}/configmaps/{name}"):
            app.router.add_patch(path, self.patch)
        return app


async def _with_clients(server: ApiServer, body):
    from kubernetes_asyncio import client

    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        config = client.Configuration(host=f"http://127.0.0.1:{port}")
        async with client.ApiClient(config) as api:
            return await body(client.BatchV1Api(api), client.CoreV1Api(api))
    finally:
        await runner.cleanup()


def test_a_reattaching_attempt_becomes_the_only_owner_of_the_running_job():
    server = ApiServer()
    asyncio.run(_with_clients(server, lambda batch, core: k8s_run._adopt(batch, core, NAME, NS, NEW_POD)))
    assert [p.rsplit("/", 2)[-2] for p, _, _ in server.patches] == ["jobs", "services", "configmaps"]
    for _, content_type, body in server.patches:
        # A JSON patch replaces the list; a strategic merge would add the new owner beside the old one.
        assert content_type == "application/json-patch+json"
        [op] = body
        assert (op["op"], op["path"]) == ("replace", "/metadata/ownerReferences")
        [owner] = op["value"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", NEW_POD["metadata"]["name"],
                                                                NEW_POD["metadata"]["uid"])


def test_a_job_deleted_while_it_is_watched_is_a_lost_node():
    server = ApiServer()
    said: list[str] = []

    async def watch(batch, core):
        waiting = asyncio.create_task(k8s_run._wait(batch, NAME, NS, said.append, poll_s=0.05))
        while not said:  # it has seen the Job running
            await asyncio.sleep(0.01)
        server.jobs[NAME] = None
        return await waiting

    state = asyncio.run(_with_clients(server, watch))
    assert state.final and not state.succeeded and "deleted" in state.reason
    assert "active" in said[0] and said[-1] == f"training Job {NAME}: {state.reason}"
    with pytest.raises(NodeLost, match="resumes from the newest checkpoint"):
        k8s_status.outcome(NAME, state, [None, None])


def test_the_nodes_job_gets_the_flow_jobs_maximum_run_time():
    server = ApiServer()
    deadline = RUNNING["spec"].get("activeDeadlineSeconds") or 4 * 3600
    server.jobs["prefect-flow-job"] = {**RUNNING, "metadata": {"name": "prefect-flow-job", "namespace": NS},
                                       "spec": {**RUNNING["spec"], "activeDeadlineSeconds": deadline}}
    pod = {**NEW_POD, "metadata": {**NEW_POD["metadata"], "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "prefect-flow-job", "uid": "u"}]}}
    limits = asyncio.run(_with_clients(server, lambda batch, core: k8s_run._own_job_limits(batch, pod, NS)))
    assert limits == {"active_deadline_seconds": deadline}
    assert asyncio.run(_with_clients(server, lambda batch, core: k8s_run._own_job_limits(batch, NEW_POD, NS))) == {}
