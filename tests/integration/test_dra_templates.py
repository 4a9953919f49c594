"""DRA mode without side effects at admission: the scheduler's real aiohttp app answers
``/webhook`` (a forged AdmissionReview creates nothing), and the template reconciler
creates a translated pod's ResourceClaimTemplate from the engine's pod watch once the
pod exists, only for a valid signature. The engine runs on the FakeKube (the watch);
the DRA objects go through the recording lightkube stub of tests/dra/test_webhook.py.
The real control plane path is tests/e2e/test_dra_e2e.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import jsonpatch
from aiohttp.test_utils import TestClient, TestServer

from hami.dra import signedspecs
from hami.dra import translate as tr
from hami.scheduler.engine import Engine
from hami.scheduler.routes import build_app
from tests.dra.test_webhook import _Client

from .fake_kube import FakeKube
from .support import SETTINGS, run

SPEC = tr.claim_spec(1, 1000, 0, [])
NAME = tr.template_for(SPEC)[0]


def _review(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "forged", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "CREATE", "namespace": namespace, "object": pod}}


def _gpu_pod(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {
                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}]}}


def _naming(name: str, namespace: str, template: str,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod that names a template itself (no nvidia.com resources)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": dict(annotations or {})},
            "spec": {"resourceClaims": [{"name": "gpu-0", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "c", "image": "x",
                                     "resources": {"claims": [{"name": "gpu-0"}]}}]},
            "status": {"phase": "Pending"}}


class _Bed:
    def __init__(self, kube: FakeKube, client: _Client, http: TestClient,
                 engine: Engine | None = None) -> None:
        self.kube, self.client, self.http = kube, client, http
        self.engine = engine

    async def review(self, pod: dict[str, Any], namespace: str) -> dict[str, Any]:
        resp = await self.http.post("/webhook", data=json.dumps(_review(pod, namespace)),
                                    headers={"Content-Type": "application/json"})
        assert resp.status == 200, await resp.text()
        return (await resp.json())["response"]  # type: ignore[no-any-return]

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def _serving(*, reconcile: bool = True) -> AsyncIterator[_Bed]:
    """The scheduler's app in DRA mode as ``hami scheduler --dra-mode`` wires it
    (``reconcile=False``: the webhook alone, as a build without the reconciler has it)."""
    kube, client = FakeKube(), _Client()
    settings = replace(SETTINGS, dra_mode=True)
    engine = Engine(settings, kube)
    templates = None
    if reconcile:
        from hami.scheduler.draparts import dra_parts

        webhook, prioritize, templates = dra_parts(engine, client)
    else:
        from hami.dra.webhook import DraWebhook

        webhook = DraWebhook(client, engine.config, engine.admit, engine.state.quota)
        prioritize = None
    await engine.start()
    http = TestClient(TestServer(build_app(engine, settings, webhook, prioritize)))
    await http.start_server()
    try:
        yield _Bed(kube, client, http, engine)
    finally:
        await http.close()
        await engine.stop()
        if templates is not None:
            await templates.stop()


def test_a_forged_admission_review_writes_nothing() -> None:
    """Anyone who reaches the webhook port can POST an AdmissionReview naming any
    namespace: the answer is the patch, and no API object is created."""

    async def scenario() -> None:
        async with _serving(reconcile=False) as bed:
            resp = await bed.review(_gpu_pod("p", "victim"), "victim")
            assert resp["allowed"], resp
            ops = json.loads(base64.b64decode(resp["patch"]))
            assert any(op["path"] == "/spec/resourceClaims" for op in ops)
            assert bed.client.created == []
            assert bed.client.objs == []

    run(scenario)


def test_the_admitted_pod_gets_its_template_from_the_pod_watch() -> None:
    """The API server admits the patched pod; the scheduler sees it in its pod watch and
    creates the template the patch names, as the signed spec says; a second pod of the
    same shape reuses it (no second create)."""

    async def scenario() -> None:
        async with _serving() as bed:
            pod = _gpu_pod("p", "team")
            resp = await bed.review(pod, "team")
            admitted = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
            assert bed.client.created == []
            assert admitted["spec"]["resourceClaims"] == [
                {"name": "gpu-0", "resourceClaimTemplateName": NAME}]
            bed.kube.put("Pod", admitted)
            await bed.settle()
            assert bed.client.created == [("team", NAME)]
            (made,) = bed.client.objs
            assert made["spec"] == tr.template_for(SPEC)[1]["spec"]
            assert made["metadata"]["labels"] == {tr.TEMPLATE_LABEL: "true"}
            second = jsonpatch.apply_patch(_gpu_pod("q", "team"), json.loads(base64.b64decode(
                (await bed.review(_gpu_pod("q", "team"), "team"))["patch"])))
            bed.kube.put("Pod", second)
            await bed.settle()
            assert bed.client.created == [("team", NAME)]
            assert not bed.kube.events

    run(scenario)


def test_a_pod_without_a_valid_signature_gets_no_template() -> None:
    """A pod created with a hami template name (the webhook bypassed or down) and no,
    a tampered, a copied-from-another-namespace or a foreign-key signature: nothing is
    created, and a Warning Event on the pod says why, once."""
    key = b"k" * 32
    elsewhere = signedspecs.sign(signedspecs.process_keys().signing_key(), "other",
                                 {NAME: tr.template_for(SPEC)[1]})
    bigger = tr.template_for(tr.claim_spec(1, 30000, 0, []))[1]
    tampered = {**elsewhere, signedspecs.SPECS_ANNOTATION: json.dumps([bigger["spec"]["spec"]])}
    cases = {"none": {}, "elsewhere": elsewhere, "tampered": tampered,
             "foreign": signedspecs.sign(key, "team", {NAME: tr.template_for(SPEC)[1]}),
             "junk": {signedspecs.SPECS_ANNOTATION: "[", signedspecs.SIGNATURE_ANNOTATION: "x"}}

    async def scenario() -> None:
        async with _serving() as bed:
            for case, annotations in cases.items():
                bed.kube.put("Pod", _naming(case, "team", NAME, annotations))
            await bed.settle()
            assert bed.client.created == []
            refused = [e for e in bed.kube.events if e["reason"] == "DraTemplateRefused"]
            assert sorted(e["involvedObject"]["name"] for e in refused) == sorted(cases)
            assert all(e["type"] == "Warning" and NAME in e["message"] for e in refused)
            # a status update of a refused pod is not looked at again
            bed.kube.put("Pod", {**_naming("none", "team", NAME),
                                 "status": {"phase": "Pending", "conditions": []}})
            await bed.settle()
            assert len(bed.kube.events) == len(cases)

    run(scenario)


def test_a_template_a_tenant_made_under_hamis_name_is_not_reused() -> None:
    """Between admission and the pod watch a tenant creates hami's template name asking
    30000 MiB: the reconciler leaves it and reports it on the pod."""

    async def scenario() -> None:
        async with _serving() as bed:
            pod = _gpu_pod("p", "team")
            resp = await bed.review(pod, "team")
            admitted = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
            forged = tr.template_for(tr.claim_spec(1, 30000, 0, []))[1]
            bed.client.templates[("team", NAME)] = {
                **forged, "metadata": {"name": NAME, "namespace": "team"}}
            bed.kube.put("Pod", admitted)
            await bed.settle()
            assert bed.client.created == []
            (event,) = bed.kube.events
            assert event["reason"] == "DraTemplateRefused" and "asks for something else" in \
                event["message"]

    run(scenario)


def test_a_refusal_is_recorded_whichever_replica_leads_and_once_across_restarts() -> None:
    """A follower replica sees the pod first and then leads: its refusal must not be lost
    (it used to be posted by the leader only, from each replica's own memory). Every
    replica posts it under one name fixed by the pod and the refusal, so a replica that
    restarts (or another one) posting it again makes the API server answer 409 instead
    of adding a second Event."""

    async def scenario() -> None:
        names = []
        for _ in range(2):  # the same pod, seen by a fresh replica each time
            async with _serving() as bed:
                assert bed.engine is not None
                bed.engine.leader = False
                bed.kube.put("Pod", {**_naming("bare", "team", NAME), "metadata": {
                    **_naming("bare", "team", NAME)["metadata"], "uid": "uid-bare"}})
                await bed.settle()
                await asyncio.sleep(0.05)
                (event,) = [e for e in bed.kube.events if e["reason"] == "DraTemplateRefused"]
                names.append(event["metadata"]["name"])
        assert names[0] == names[1] and names[0].startswith("bare.")

    run(scenario)
