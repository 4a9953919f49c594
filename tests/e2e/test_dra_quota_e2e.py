"""DRA mode's namespace GPU quota against the claims and templates a tenant writes itself,
on the real kube-apiserver: the DRA webhook runs in-process with a lightkube client on
the real API (its answer is applied as the apiserver would), the objects it reads and
writes are real, and the pods it admits are created for real. The quota's limits are
given to the webhook's ledger directly (the scheduler fills it from ResourceQuotas).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from hami.core.quota import QuotaLedger
from hami.devices.registry import make_config
from hami.dra import translate as tr
from hami.dra.signedspecs import process_keys, sign
from hami.dra.slices import DRIVER
from hami.dra.templates import TemplateReconciler
from hami.dra.webhook import DraWebhook
from hami.testing.controlplane import ControlPlane, create_gpu_node, ensure_namespace

from .drabed import Cards, ensure_device_class, publish_cards
from .hami_harness import reconcile_templates

pytestmark = pytest.mark.e2e

NS = "draquota"
LIMIT_MIB = 20000
CARD_MIB = 16384


def _request(memory: str) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": DRIVER,
                                       "allocationMode": "ExactCount", "count": 1,
                                       "capacity": {"requests": {"memory": memory}}}}


def _template(name: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [_request(memory)]}}}}


def _claim(name: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [_request(memory)]}}}


def _pod(name: str, limits: dict[str, Any] | None = None,
         claims: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "pause",
                                 "resources": {"limits": limits or {"cpu": "100m"}}}
    spec: dict[str, Any] = {"containers": [container]}
    if claims:
        spec["resourceClaims"] = claims
        container["resources"]["claims"] = [{"name": c["name"]} for c in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def _admit(cp: ControlPlane, quota: QuotaLedger, pod: dict[str, Any]) -> dict[str, Any]:
    """The DRA webhook's AdmissionReview response for ``pod`` (the real API behind it)."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE",
                          "object": pod}}

    async def run() -> dict[str, Any]:
        client = cp.async_client()
        try:
            hook = DraWebhook(client, make_config(), lambda b: {"response": {"allowed": True}},
                              quota)
            return await hook(json.dumps(review).encode())
        finally:
            await client.close()

    return asyncio.run(run())["response"]  # type: ignore[no-any-return]


def _create_admitted(cp: ControlPlane, client: Any, quota: QuotaLedger,
                     pod: dict[str, Any]) -> None:
    from lightkube import codecs

    resp = _admit(cp, quota, pod)
    assert resp["allowed"], resp
    if "patch" in resp:
        pod = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
    created = client.create(codecs.from_dict(pod))
    # hami's scheduler creates the templates from its pod watch once the pod exists
    assert "refused" not in str(reconcile_templates(cp, created))


def test_tenant_claims_and_templates_meet_the_quota(control_plane: ControlPlane,
                                                     tmp_path: Path) -> None:
    from lightkube import codecs

    cp, client = control_plane, control_plane.client()
    ensure_namespace(client, NS)
    ensure_device_class(client)  # another test of the session may have made it
    node = "draquota-0"
    create_gpu_node(client, node, gpus=0)
    publish_cards(client, node, tmp_path / "inv.yaml", Cards(2, CARD_MIB))
    quota = QuotaLedger(make_config().registry["NVIDIA"].resource_names())
    quota.set_quota(NS, "gpu", {"limits.nvidia.com/gpumem": LIMIT_MIB})

    # The tenant's own template asking more than the namespace may have: the pod naming it
    # is refused, with the template named.
    client.create(codecs.from_dict(_template("tenant-big", "30000Mi")))
    resp = _admit(cp, quota, _pod("uses-big", claims=[
        {"name": "g", "resourceClaimTemplateName": "tenant-big"}]))
    assert not resp["allowed"], resp
    assert "exceeding resource quota" in resp["status"]["message"]
    assert f"ResourceClaimTemplate {NS}/tenant-big" in resp["status"]["message"]
    # ... and so is a pod naming a template that does not exist (yet).
    resp = _admit(cp, quota, _pod("uses-absent", claims=[
        {"name": "g", "resourceClaimTemplateName": "later"}]))
    assert not resp["allowed"] and "does not exist" in resp["status"]["message"], resp

    # The tenant's own claim of 12000 MiB is counted once: pods sharing it are admitted.
    client.create(codecs.from_dict(_claim("tenant-shared", "12000Mi")))
    for name in ("shares-1", "shares-2"):
        _create_admitted(cp, client, quota, _pod(name, claims=[
            {"name": "g", "resourceClaimName": "tenant-shared"}]))
    # An honest template within what is left (12000 + 2000 <= 20000) is admitted.
    client.create(codecs.from_dict(_template("tenant-small", "2000Mi")))
    _create_admitted(cp, client, quota, _pod("uses-small", claims=[
        {"name": "g", "resourceClaimTemplateName": "tenant-small"}]))

    # hami's own template is reused as the API server stores it (2048Mi comes back 2Gi).
    honest = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048}
    _create_admitted(cp, client, quota, _pod("honest-1", honest))
    _create_admitted(cp, client, quota, _pod("honest-2", honest))

    # The attacker's path: a template pre-made under the name hami gives a 1000 MiB
    # request, asking 30000 MiB. A 1000 MiB GPU pod is refused, the template named.
    name, _ = tr.template_for(tr.claim_spec(1, 1000, 0, []))
    client.create(codecs.from_dict(_template(name, "30000Mi")))
    resp = _admit(cp, quota, _pod("gets-forged", {"nvidia.com/gpu": 1,
                                                   "nvidia.com/gpumem": 1000}))
    assert not resp["allowed"], resp
    assert f"ResourceClaimTemplate {NS}/{name}" in resp["status"]["message"]


def test_hami_templates_read_back_from_the_api_are_hamis(control_plane: ControlPlane) -> None:
    """Every shape of template hami writes (several cards with a constraint, selectors, a
    prioritized list of MIG profiles, a whole card, amounts the API server rewrites such
    as 2048Mi) is recognised as hami's after the API server stored it: a second pod
    asking the same is admitted, not refused as a tenant's template."""
    cp = control_plane
    ensure_namespace(cp.client(), NS)
    sel = tr.selectors({"nvidia.com/use-gputype": "A100,T4",
                        "nvidia.com/nouse-gpuuuid": "GPU-1"})
    specs = [tr.claim_spec(2, 2048, 10, sel), tr.claim_spec(1, 4096, 5, sel, ["1g.5gb", "3g.20gb"]),
             tr.claim_spec(1, 0, 0, []), tr.claim_spec(3, 1536, 100, [])]

    async def run() -> list[str | None]:
        client = cp.async_client()
        try:
            hook = DraWebhook(client, make_config(), lambda b: {"response": {}})
            out: list[str | None] = []
            for spec in specs:
                name, template = tr.template_for(spec)
                pod = {"metadata": {"name": "p", "namespace": NS, "uid": name,
                                    "annotations": sign(process_keys().signing_key(), NS,
                                                        {name: template})},
                       "spec": {"resourceClaims": [{"name": "g",
                                                    "resourceClaimTemplateName": name}]}}
                made = await TemplateReconciler(client, process_keys()).reconcile(pod)
                out.append(None if made == {name: "created"} else str(made))
                out.append(await hook._conflict(NS, template))  # read back and compared
            return out
        finally:
            await client.close()

    assert asyncio.run(run()) == [None] * (2 * len(specs))
    from lightkube.resources.resource_v1 import ResourceClaimTemplate

    names = {t.metadata.name for t in cp.client().list(ResourceClaimTemplate, namespace=NS)}
    assert {tr.template_for(s)[0] for s in specs} <= names
