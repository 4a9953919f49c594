"""DRA mode, a pod that gets hami's GPU through a ResourceClaim or ResourceClaimTemplate
the tenant made itself (hami's DeviceClass, allowed and counted against the namespace's
quota): the containers using it keep the rules of GPU containers, the priority-0 grant
among them, through the scheduler's real aiohttp app (``/webhook``). Before, such a pod
named no ``nvidia.com`` resource and no ``hami-gpu-`` template, so no rule applied: a
container with ``CUDA_TASK_PRIORITY=0`` (read by the monitor for the claim's region,
:func:`hami.monitor.claims.attribute`), privileged or on the host's PID namespace was
admitted. Claims of other drivers are left alone. The DRA objects go through the
recording lightkube stub of tests/dra/test_webhook.py."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from hami.dra.webhook import DraWebhook
from hami.scheduler.engine import Engine
from hami.scheduler.routes import build_app
from tests.dra.test_webhook import _api_error, _Client, _Obj

from .fake_kube import FakeKube
from .support import SETTINGS, run

HAMI_CLASS, OTHER_CLASS = "gpu.hami.io", "nic.example.com"


def _spec(device_class: str) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "dev", "exactly": {
        "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}}]}}


class _Api(_Client):
    """The stub, with ResourceClaims read by ``get`` as well (by kind)."""

    async def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
        if res.__name__ != "ResourceClaim":
            return await super().get(res, name, namespace)
        for claim in self.claims:
            if (claim["metadata"]["namespace"], claim["metadata"]["name"]) == (namespace, name):
                return _Obj(claim)
        raise _api_error(404, "not found")


def _api() -> _Api:
    claims = [{"metadata": {"name": cls, "namespace": ns}, "spec": _spec(cls)}
              for cls in (HAMI_CLASS, OTHER_CLASS) for ns in ("tenant", "inference")]
    templates = {(ns, cls): {"metadata": {"name": cls, "namespace": ns},
                             "spec": {"spec": _spec(cls)}}
                 for cls in (HAMI_CLASS, OTHER_CLASS) for ns in ("tenant", "inference")}
    return _Api(claims=claims, templates=templates)


def _pod(namespace: str, entry: dict[str, str], **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": namespace},
            "spec": {"resourceClaims": [{"name": "dev", **entry}],
                     "containers": [{"name": "c", "image": "x",
                                     "resources": {"claims": [{"name": "dev"}]}, **container},
                                    {"name": "side", "image": "x"}]}}


PRIORITY_0 = {"env": [{"name": "CUDA_TASK_PRIORITY", "value": "0"}]}
PRIVILEGED = {"securityContext": {"privileged": True}}


@contextlib.asynccontextmanager
async def _serving() -> AsyncIterator[TestClient]:
    kube = FakeKube()
    settings = replace(SETTINGS, dra_mode=True, high_priority_namespaces=("inference",))
    engine = Engine(settings, kube)
    webhook = DraWebhook(_api(), engine.config, engine.admit, engine.state.quota)
    await engine.start()
    http = TestClient(TestServer(build_app(engine, settings, webhook, None)))
    await http.start_server()
    try:
        yield http
    finally:
        await http.close()
        await engine.stop()


async def _review(http: TestClient, pod: dict[str, Any]) -> dict[str, Any]:
    namespace = pod["metadata"]["namespace"]
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "CREATE", "namespace": namespace, "object": pod}}
    resp = await http.post("/webhook", data=json.dumps(body),
                           headers={"Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    return (await resp.json())["response"]  # type: ignore[no-any-return]


def test_a_tenant_hami_claim_or_template_keeps_the_gpu_rules() -> None:
    async def scenario() -> None:
        async with _serving() as http:
            for entry in ({"resourceClaimName": HAMI_CLASS},
                          {"resourceClaimTemplateName": HAMI_CLASS}):
                resp = await _review(http, _pod("tenant", entry, **PRIORITY_0))
                assert not resp["allowed"], (entry, resp)
                assert "CUDA_TASK_PRIORITY 0" in resp["status"]["message"], resp
                resp = await _review(http, _pod("tenant", entry, **PRIVILEGED))
                assert not resp["allowed"] and "privileged" in resp["status"]["message"], resp
                evil = _pod("tenant", entry)
                evil["spec"]["hostPID"] = True
                assert not (await _review(http, evil))["allowed"], entry
                # the honest paths: priority 1, or 0 in the granted namespace
                one = _pod("tenant", entry, env=[{"name": "CUDA_TASK_PRIORITY", "value": "1"}])
                assert (await _review(http, one))["allowed"], entry
                assert (await _review(http, _pod("inference", entry, **PRIORITY_0)))["allowed"]

    run(scenario)


def test_a_claim_that_cannot_be_read_counts_as_hamis() -> None:
    """A named claim or template not there yet (or unreadable) may be created later with
    hami's DeviceClass: its containers keep the rules (fail closed)."""

    async def scenario() -> None:
        async with _serving() as http:
            for entry in ({"resourceClaimName": "later"},
                          {"resourceClaimTemplateName": "later"}):
                resp = await _review(http, _pod("tenant", entry, **PRIORITY_0))
                assert not resp["allowed"], (entry, resp)

    run(scenario)


def test_claims_of_other_drivers_are_left_alone() -> None:
    async def scenario() -> None:
        async with _serving() as http:
            for entry in ({"resourceClaimName": OTHER_CLASS},
                          {"resourceClaimTemplateName": OTHER_CLASS}):
                resp = await _review(http, _pod("tenant", entry, **PRIVILEGED))
                assert resp["allowed"], (entry, resp)

    run(scenario)
