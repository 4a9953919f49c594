"""DRA mode's ``/webhook`` does a bounded amount of work per AdmissionReview: the
scheduler's real aiohttp app answers, and every API request the webhook makes is counted
at the lightkube client (the recording stub of tests/dra/test_webhook.py: its ``get`` and
``list`` are the requests the API server would see).

The attacker's path: anyone who reaches the webhook port can POST a review. One naming
the same template in 12,000 entries of ``spec.resourceClaims`` made the scheduler issue
12,002 requests (one template GET per entry, plus the LISTs); it is now refused before
any request. The honest path: a pod naming a few templates and claims is read once per
distinct name, and a slow API server makes a review fail closed at the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from hami.dra import bounds
from hami.dra.webhook import DraWebhook
from hami.scheduler.engine import Engine
from hami.scheduler.routes import build_app
from tests.dra.test_webhook import _claim, _Client, _slice
from tests.dra.test_webhook_named_claims import LIMIT_MIB, _template

from .fake_kube import FakeKube
from .support import SETTINGS, run


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "forged", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "CREATE", "namespace": "ns", "object": pod}}


def _naming(entries: list[dict[str, str]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"resourceClaims": entries,
                     "containers": [{"name": "c", "image": "x", "resources": {
                         "claims": [{"name": e["name"]} for e in entries]}}]}}


def _requests(client: _Client) -> int:
    """The API requests the webhook made through ``client`` (GETs and LISTs)."""
    return len(client.gets) + len(client.lists)


class _Bed:
    def __init__(self, client: _Client, http: TestClient) -> None:
        self.client, self.http = client, http

    async def review(self, pod: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(_review(pod))
        resp = await self.http.post("/webhook", data=body,
                                    headers={"Content-Type": "application/json"})
        assert resp.status == 200, await resp.text()
        return (await resp.json())["response"]  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def _serving(client: _Client, deadline_s: float = bounds.REVIEW_DEADLINE_S
                   ) -> AsyncIterator[_Bed]:
    """The scheduler's app in DRA mode, with a 20000 MiB GPU quota on namespace ns."""
    settings = replace(SETTINGS, dra_mode=True, max_body_bytes=4 << 20)
    engine = Engine(settings, FakeKube())
    engine.state.quota.set_quota("ns", "gpu", {"limits.nvidia.com/gpumem": LIMIT_MIB})
    webhook = DraWebhook(client, engine.config, engine.admit, engine.state.quota,
                         deadline_s=deadline_s)
    await engine.start()
    http = TestClient(TestServer(build_app(engine, settings, webhook)))
    await http.start_server()
    try:
        yield _Bed(client, http)
    finally:
        await http.close()
        await engine.stop()


def _stocked() -> _Client:
    return _Client([_slice("n1", 16384)], [_claim("mine", {"memory": "1000Mi"})],
                   templates={("ns", "t"): _template("t", "1Mi"),
                              ("ns", "u"): _template("u", "2000Mi")})


def test_a_forged_review_naming_one_template_12000_times_costs_no_request() -> None:
    """0.87 MB of review, 12,000 entries naming template t: refused, with a message that
    names the limit, before any API request (was 12,002 requests)."""
    entries = [{"name": f"e{i}", "resourceClaimTemplateName": "t"} for i in range(12000)]
    pod = _naming(entries)
    assert len(json.dumps(_review(pod))) > 800_000

    async def scenario() -> None:
        async with _serving(_stocked()) as bed:
            resp = await bed.review(pod)
            assert not resp["allowed"], resp
            message = resp["status"]["message"]
            assert "12000 entries" in message and str(bounds.MAX_POD_CLAIMS) in message
            assert _requests(bed.client) == 0, (bed.client.gets[:3], bed.client.lists)

    run(scenario)


def test_reads_per_review_are_bounded_by_the_distinct_names() -> None:
    """The honest path at the limit: MAX_POD_CLAIMS entries naming two templates and one
    claim read each template once, plus one LIST of claims and one of slices; what they
    ask is still counted per entry (each template entry is a claim)."""
    n = bounds.MAX_POD_CLAIMS
    entries = [{"name": f"e{i}", "resourceClaimTemplateName": "t" if i % 2 else "u"}
               for i in range(n - 1)] + [{"name": "own", "resourceClaimName": "mine"}]

    async def scenario() -> None:
        async with _serving(_stocked()) as bed:
            # the first review starts the scheduler's slice and claim watch (one LIST each)
            await bed.review(_naming(entries[:1]))
            bed.client.gets.clear()
            bed.client.lists.clear()
            resp = await bed.review(_naming(entries))
            # 63 x 2000 MiB of template u alone is over 20000 MiB
            assert not resp["allowed"], resp
            assert "exceeding resource quota" in resp["status"]["message"]
            assert sorted(bed.client.gets) == [("ns", "t"), ("ns", "u")]
            assert len(bed.client.lists) <= 3, bed.client.lists
            bed.client.gets.clear()
            bed.client.lists.clear()
            small = [{"name": f"e{i}", "resourceClaimTemplateName": "t"} for i in range(n)]
            assert (await bed.review(_naming(small)))["allowed"]
            assert bed.client.gets == [("ns", "t")]

    run(scenario)


class _Slow(_Client):
    """An API server that never answers a template read."""

    async def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
        self.gets.append((str(namespace), name))
        await asyncio.sleep(3600)


def test_a_review_past_its_deadline_is_refused_with_the_reason() -> None:
    """Fail closed, in time for the API server's webhook timeout (10 s by default)."""
    client = _Slow([_slice("n1", 16384)], templates={("ns", "t"): _template("t", "1Mi")})

    async def scenario() -> None:
        async with _serving(client, deadline_s=0.5) as bed:
            started = time.monotonic()
            resp = await bed.review(_naming([{"name": "a", "resourceClaimTemplateName": "t"}]))
            # answered before the API server gives up (timeoutSeconds 10): without the
            # deadline the read never ends
            assert time.monotonic() - started < 10
            assert not resp["allowed"], resp
            assert "did not finish within 0.5 s" in resp["status"]["message"]

    run(scenario)


def test_the_template_reconciler_reads_nothing_for_a_pod_naming_too_many() -> None:
    """The pod watch's side: a pod created (webhook bypassed) naming 5,000 distinct
    hami template names gets one Warning Event and not one template read."""
    from hami.dra import signedspecs

    from .test_dra_templates import _serving as _reconciling

    entries = [{"name": f"e{i}",
                "resourceClaimTemplateName": f"{signedspecs.NAME_PREFIX}{i:08x}"}
               for i in range(5000)]
    pod = {**_naming(entries), "status": {"phase": "Pending"}}
    pod["metadata"]["uid"] = "uid-many"

    async def scenario() -> None:
        async with _reconciling() as bed:
            bed.kube.put("Pod", pod)
            await bed.settle()
            assert bed.client.gets == [] and bed.client.created == []
            (event,) = bed.kube.events
            assert event["reason"] == "DraTemplateRefused"
            assert "5000 entries" in event["message"], event
            bed.kube.put("Pod", {**pod, "status": {"phase": "Pending", "conditions": []}})
            await bed.settle()
            assert len(bed.kube.events) == 1 and bed.client.gets == []

    run(scenario)


def test_a_namespace_without_quota_is_bounded_too() -> None:
    """The attacker's path where no quota applies: 12,000 entries naming one of the
    tenant's own claims in a namespace without a GPU quota. Which containers use a claim
    of hami's class is read per named object (the GPU-container rules), so the limit on
    entries comes first there too: refused before any request; and under the limit one
    claim named by many entries is read once."""
    entries = [{"name": f"e{i}", "resourceClaimName": "mine"} for i in range(12000)]

    async def scenario() -> None:
        async with _serving(_stocked()) as bed:
            pod = _naming(entries)
            pod["metadata"]["namespace"] = "free"
            review = _review(pod)
            review["request"]["namespace"] = "free"
            resp = await bed.http.post("/webhook", data=json.dumps(review),
                                       headers={"Content-Type": "application/json"})
            answer = (await resp.json())["response"]
            assert not answer["allowed"], answer
            assert "12000 entries" in answer["status"]["message"]
            assert _requests(bed.client) == 0, (bed.client.gets[:3], bed.client.lists)
            few = _naming(entries[:bounds.MAX_POD_CLAIMS])
            few["metadata"]["namespace"] = "free"
            review = _review(few)
            review["request"]["namespace"] = "free"
            await bed.http.post("/webhook", data=json.dumps(review),
                                headers={"Content-Type": "application/json"})
            assert bed.client.gets.count(("free", "mine")) <= 1, bed.client.gets[:5]

    run(scenario)
