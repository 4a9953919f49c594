"""The DRA webhook shell: AdmissionReview in, reply out (the API client is a stub that
records template creations and lists the slices and claims it was given, as lightkube's
AsyncClient does; the real apiserver path is in tests/e2e/test_dra_e2e.py)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from hami.core.quota import QuotaLedger
from hami.devices.registry import make_config
from hami.dra.slices import MIB
from hami.dra.webhook import DraWebhook, claim_booking


class _Obj:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def to_dict(self) -> dict[str, Any]:
        return self.doc


class _Listing:
    """What ``AsyncClient.list`` returns: async iteration, then ``resourceVersion``."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.docs = docs
        self.resourceVersion = "1"

    async def __aiter__(self) -> Any:
        for d in self.docs:
            yield _Obj(d)


def _api_error(code: int, message: str = "") -> Any:
    from lightkube import ApiError
    from lightkube.models.meta_v1 import Status

    return ApiError(status=Status(code=code, message=message or f"code {code}"))


class _Client:
    """Templates live in ``templates`` (``(namespace, name)`` -> dict): ``create`` adds
    (409 when there), ``get`` reads (404 when absent), as the API server does."""

    def __init__(self, slices: list[dict[str, Any]] | None = None,
                 claims: list[dict[str, Any]] | None = None,
                 templates: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.created: list[Any] = []
        self.slices = slices or []
        self.claims = claims or []
        self.templates = templates if templates is not None else {}
        self.lists: list[str] = []
        self.objs: list[dict[str, Any]] = []
        self.gets: list[tuple[str, str]] = []

    async def create(self, obj: Any, namespace: str | None = None) -> None:
        key = (str(namespace), obj.metadata.name)
        if key in self.templates:
            raise _api_error(409, "already exists")
        self.created.append((namespace, obj.metadata.name))
        self.objs.append(obj.to_dict())
        self.templates[key] = obj.to_dict()

    async def get(self, res: Any, name: str, namespace: str | None = None) -> _Obj:
        self.gets.append((str(namespace), name))
        doc = self.templates.get((str(namespace), name))
        if doc is None:
            raise _api_error(404, "not found")
        return _Obj(doc)

    def list(self, res: Any, namespace: str | None = None, labels: Any = None) -> _Listing:
        self.lists.append(res.__name__)
        if res.__name__ == "ResourceSlice":
            return _Listing(self.slices)
        return _Listing([c for c in self.claims if (namespace in ("*", None)
                         or c["metadata"]["namespace"] == namespace)
                         and all((c["metadata"].get("labels") or {}).get(k) == v
                                 for k, v in (labels or {}).items())])

    async def watch(self, res: Any, **kw: Any) -> Any:
        await asyncio.Event().wait()  # nothing changes
        yield None


def _slice(node: str, *card_mib: int) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-gpu.hami.io"},
            "spec": {"driver": "gpu.hami.io", "nodeName": node, "pool": {"name": node},
                     "devices": [{"name": f"gpu-{i}",
                                  "capacity": {"memory": {"value": str(m * MIB)}}}
                                 for i, m in enumerate(card_mib)]}}


def _claim(name: str, requests: dict[str, str], consumed: dict[str, str] | None = None,
           count: int = 1) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "labels": {"hami.io/dra-template": "true"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.hami.io", "count": count,
            "capacity": {"requests": requests}}}]}}}
    if consumed is not None:
        doc["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.hami.io", "pool": "n1", "device": "gpu-0",
             "consumedCapacity": consumed}]}}}
    return doc


def _review(pod: Any, operation: str = "CREATE") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": operation,
                                   "object": pod}}).encode()


def _pod(limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}], **spec}}


def _signed(resp: dict[str, Any], pod: dict[str, Any], namespace: str = "ns"
            ) -> list[dict[str, Any]]:
    """The templates the reply's patch puts on ``pod`` signed (what the reconciler will
    create once the pod exists), in name order."""
    import jsonpatch

    from hami.dra.signedspecs import process_keys, signed_templates

    out = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
    found = signed_templates(process_keys().verifying_keys(), namespace,
                             out["metadata"]["annotations"])
    return [found[name] for name in sorted(found)]


def _hook(client: _Client, quota: QuotaLedger | None = None) -> tuple[DraWebhook, list[bytes]]:
    seen: list[bytes] = []

    def fallback(body: bytes) -> dict[str, Any]:
        seen.append(body)
        return {"response": {"uid": "", "allowed": True, "fallback": True}}

    return DraWebhook(client, make_config(), fallback, quota), seen


def test_gpu_pod_gets_claim_patch_and_signed_template_spec() -> None:
    """The patch names the template and carries its spec signed; the webhook itself
    creates nothing (the scheduler's reconciler does once the pod exists)."""
    client = _Client()
    hook, seen = _hook(client)
    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100})
    reply = asyncio.run(hook(_review(pod)))
    resp = reply["response"]
    assert resp["allowed"] and resp["uid"] == "u1" and not seen
    ops = json.loads(base64.b64decode(resp["patch"]))
    (claims,) = [op["value"] for op in ops if op["path"] == "/spec/resourceClaims"]
    # placed by the scheduler's profile (the chart's kube-scheduler with /prioritize)
    assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in ops
    (template,) = _signed(resp, pod)
    assert claims == [{"name": "gpu-0",
                       "resourceClaimTemplateName": template["metadata"]["name"]}]
    assert template["metadata"]["name"].startswith("hami-gpu-")
    assert client.created == []


def test_a_dry_run_creates_no_template() -> None:
    """``kubectl create --dry-run=server`` reaches the webhook too: the pod is translated
    as usual and nothing is created (the webhook never creates: ``sideEffects: None``)."""
    client = _Client()
    hook, _ = _hook(client)
    doc = json.loads(_review(_pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100})))
    doc["request"]["dryRun"] = True
    resp = asyncio.run(hook(json.dumps(doc).encode()))["response"]
    assert resp["allowed"]
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert any(op["path"] == "/spec/resourceClaims" for op in ops)
    assert client.created == []


def test_denials_and_pass_throughs() -> None:
    client = _Client([_slice("n1", 16384), _slice("n2", 15360)])
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


def test_percentage_accepted_when_every_published_card_has_one_size() -> None:
    client = _Client([_slice("n1", 16384, 16384), _slice("n2", 16384)])
    hook, _ = _hook(client)
    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25})
    resp = asyncio.run(hook(_review(pod)))["response"]
    assert resp["allowed"], resp
    (template,) = _signed(resp, pod)  # the template asks 25% of 16 GiB
    (req,) = template["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"]["capacity"]["requests"]["memory"] == "4096Mi"


def test_booking_allocated_whole_card_counts_the_card() -> None:
    """An allocated claim books what it consumes: a whole-card claim (no memory asked)
    its card's memory; one not allocated yet what it asks, a whole card the largest card."""
    whole = _claim("w", {"cores": "0"}, consumed={"memory": f"{16384 * MIB}", "cores": "0"})
    assert claim_booking(whole, 20000) == (16384, 0)
    assert claim_booking(_claim("p", {"cores": "10"}, count=2), 20000) == (40000, 20)
    assert claim_booking(_claim("m", {"memory": "2000Mi", "cores": "5"}), 20000) == (2000, 5)
    shared = _claim("s", {"memory": "2000Mi"}, consumed={"memory": "3000Mi", "cores": "7"})
    assert claim_booking(shared) == (3000, 7)


@pytest.mark.parametrize(("claims", "limits", "allowed"), [
    # a whole card allocated (16 GiB) + 2000 MiB asked and pending + 2000 MiB new > 20000
    ([_claim("w", {"cores": "0"}, consumed={"memory": f"{16384 * MIB}", "cores": "0"}),
      _claim("p", {"memory": "2000Mi"})], {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000},
     False),
    ([_claim("p", {"memory": "2000Mi"})], {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000},
     True),
    # a new whole-card pod books the largest card (16384) on top of 4000 pending
    ([_claim("p", {"memory": "4000Mi"})], {"nvidia.com/gpu": 1}, False),
])
def test_namespace_quota_counts_whole_cards_and_pending_claims(
        claims: list[dict[str, Any]], limits: dict[str, Any], allowed: bool) -> None:
    quota = QuotaLedger(make_config().registry["NVIDIA"].resource_names())
    quota.set_quota("ns", "gpu", {"limits.nvidia.com/gpumem": 20000})
    client = _Client([_slice("n1", 16384, 16384), _slice("n2", 8192)], claims)
    hook, _ = _hook(client, quota)
    resp = asyncio.run(hook(_review(_pod(limits))))["response"]
    assert resp["allowed"] is allowed, resp
    if not allowed:
        assert "exceeding resource quota" in resp["status"]["message"]


def _mig_slice(node: str) -> dict[str, Any]:
    """An A100 in MIG mode as :mod:`hami.dra.migslices` publishes it."""
    from hami.core.model import DeviceInfo, MigPlacement, MigProfile
    from hami.dra import migslices
    from hami.dra.slices import resource_slice

    card = DeviceInfo(uuid=f"GPU-{node}", index=0, split_count=7, memory_mib=40960,
                      cores_percent=100, type="NVIDIA-A100", mode="mig", mig_profiles=(
                          MigProfile("1g.5gb", 4864, 14, 1, (MigPlacement(0, 1),)),
                          MigProfile("3g.20gb", 19968, 42, 3, (MigPlacement(0, 4),))))
    doc = resource_slice(node, ())
    doc["spec"]["devices"] = migslices.instance_devices(card)
    return doc


def test_published_mig_instances_become_a_prioritized_list_and_are_not_card_sizes() -> None:
    """With MIG instances published next to 16 GiB cards, a gpumem pod's template lists
    the fitting profiles before the shared card, and a percentage still counts as one
    card size (the instances are not cards)."""
    client = _Client([_slice("n1", 16384), _mig_slice("m1")])
    hook, _ = _hook(client)
    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000})
    resp = asyncio.run(hook(_review(pod)))["response"]
    assert resp["allowed"], resp
    (template,) = _signed(resp, pod)
    (req,) = template["spec"]["spec"]["devices"]["requests"]
    assert [s["name"] for s in req["firstAvailable"]] == ["mig-1g-5gb", "mig-3g-20gb", "shared"]
    pod = _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25})
    pct = asyncio.run(hook(_review(pod)))["response"]
    assert pct["allowed"], pct
    (template,) = _signed(pct, pod)
    (req,) = template["spec"]["spec"]["devices"]["requests"]
    assert req["firstAvailable"][-1]["capacity"]["requests"]["memory"] == "4096Mi"


def test_card_sizes_leave_mig_instances_out() -> None:
    """MIG instance devices are not cards: they neither make the card sizes differ
    (percentages) nor become the largest card (whole-card quota bookings)."""
    from hami.dra.cache import card_sizes_mib

    slices = [_slice("n1", 16384), _mig_slice("m1")]
    assert card_sizes_mib(slices) == {16384}
    from hami.dra.cache import mig_offers

    assert mig_offers(slices) == {("1g.5gb", 4864), ("3g.20gb", 19968)}
