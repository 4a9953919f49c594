"""DRA mode's ``/prioritize`` with ``fragmentation-aware``, served by the scheduler's app
as ``hami scheduler --dra-mode`` wires it: the nodes' CPU comes from the engine's own
Node and Pod watches (on the FakeKube), so a node whose free CPU strands its card is
the better place for a pod light on CPU. DRA mode's scorer before it had no CPU: both
nodes scored alike."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from hami.scheduler.draparts import dra_parts
from hami.scheduler.engine import Engine
from hami.scheduler.routes import build_app
from tests.dra.test_fragscore_shared import _claim, _slice
from tests.dra.test_webhook import _Client

from .fake_kube import FakeKube
from .support import SETTINGS, run


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}, "annotations": {}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi"},
                       "capacity": {"cpu": "16", "memory": "64Gi"}}}


def _pod(name: str, cpu: str, node: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running" if node else "Pending"}}
    if node:
        pod["spec"]["nodeName"] = node
    else:
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": name}]
    return pod


def test_node_cpu_from_the_watches_steers_the_score() -> None:
    """``x`` and ``y``: one free card and 16 cores each; a CPU-only pod bound to ``y``
    holds 14 of its cores. The mix has learned a half-card pod with 4 cores (it cannot
    use ``y``'s card any more) and a quarter-card pod with 1 core; that pod scores ``y``
    (its card stranded) above ``x``."""

    async def scenario() -> None:
        kube = FakeKube()
        for n in ("x", "y"):
            kube.put("Node", _node(n))
        kube.put("Pod", _pod("cpu-hog", "14", "y"))
        client = _Client(slices=[_slice(n, 1) for n in ("x", "y")],
                         claims=[_claim("heavy", 8192), _claim("light", 4096)])
        settings = replace(SETTINGS, dra_mode=True, node_scheduler_policy="fragmentation-aware")
        engine = Engine(settings, kube)
        webhook, prioritize, templates = dra_parts(engine, client)
        prioritize.watch = False  # list on every call (the client's watch never fires)
        await engine.start()
        http = TestClient(TestServer(build_app(engine, settings, webhook, prioritize)))
        await http.start_server()
        try:
            got = []
            for name, cpu in (("heavy", "4"), ("light", "1")):
                body = {"Pod": _pod(name, cpu), "NodeNames": ["x", "y"]}
                resp = await http.post("/prioritize", data=json.dumps(body))
                assert resp.status == 200, await resp.text()
                got = await resp.json()
            scores = {s["host"]: s["score"] for s in got}
            assert scores["y"] > scores["x"], got
        finally:
            await http.close()
            await engine.stop()
            await templates.stop()

    run(scenario)
