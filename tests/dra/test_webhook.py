"""The DRA webhook shell: AdmissionReview in, reply out (the API client is a stub that
records template creations; the real apiserver path is in tests/e2e/test_dra_e2e.py)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from hami.core.config import SchedulerConfig
from hami.dra.webhook import DraWebhook


class _Client:
    def __init__(self) -> None:
        self.created: list[Any] = []

    async def create(self, obj: Any, namespace: str | None = None) -> None:
        self.created.append((namespace, obj.metadata.name))


def _review(pod: Any, operation: str = "CREATE") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": operation,
                                   "object": pod}}).encode()


def _pod(limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}], **spec}}


def _hook(client: _Client) -> tuple[DraWebhook, list[bytes]]:
    seen: list[bytes] = []

    def fallback(body: bytes) -> dict[str, Any]:
        seen.append(body)
        return {"response": {"uid": "", "allowed": True, "fallback": True}}

    return DraWebhook(client, SchedulerConfig(), fallback), seen


def test_gpu_pod_gets_claim_patch_and_template() -> None:
    client = _Client()
    hook, seen = _hook(client)
    reply = asyncio.run(hook(_review(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}))))
    resp = reply["response"]
    assert resp["allowed"] and resp["uid"] == "u1" and not seen
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert any(op["path"] == "/spec/resourceClaims" for op in ops)
    assert [ns for ns, _ in client.created] == ["ns"]
    assert client.created[0][1].startswith("hami-gpu-")


def test_denials_and_pass_throughs() -> None:
    client = _Client()
    hook, seen = _hook(client)
    pct = asyncio.run(hook(_review(_pod({"nvidia.com/gpu": 1,
                                         "nvidia.com/gpumem-percentage": 50}))))["response"]
    assert not pct["allowed"] and "gpumem-percentage" in pct["status"]["message"]
    priv = _pod({"nvidia.com/gpu": 1}, hostPID=True)
    assert not asyncio.run(hook(_review(priv)))["response"]["allowed"]
    claims = _pod({"nvidia.com/gpu": 1}, resourceClaims=[{"name": "x", "resourceClaimName": "y"}])
    left = asyncio.run(hook(_review(claims)))["response"]
    assert left["allowed"] and "patch" not in left
    assert not client.created and not seen
    for body in (b"not json", _review(_pod({"cpu": "1"})), _review("pod"),
                 _review(_pod({"nvidia.com/gpu": 1}), operation="UPDATE")):
        assert asyncio.run(hook(body))["response"].get("fallback")
    assert len(seen) == 4
