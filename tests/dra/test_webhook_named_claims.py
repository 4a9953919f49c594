"""DRA webhook, namespace GPU quota: pods that name ResourceClaims or
ResourceClaimTemplates themselves, and templates a tenant made under hami's template
names. The API client is the recording stub of ``test_webhook`` (templates it holds are
read with ``get``); the real apiserver path is in tests/e2e/test_dra_quota_e2e.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hami.core.quota import QuotaLedger
from hami.devices.registry import make_config
from hami.dra import translate as tr
from tests.dra.test_webhook import _api_error, _claim, _Client, _hook, _pod, _review, _slice

LIMIT_MIB = 20000


def _quota() -> QuotaLedger:
    quota = QuotaLedger(make_config().registry["NVIDIA"].resource_names())
    quota.set_quota("ns", "gpu", {"limits.nvidia.com/gpumem": LIMIT_MIB})
    return quota


def _template(name: str, memory: str, cores: str = "0") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.hami.io", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}}}}


def _claiming(*entries: dict[str, str]) -> dict[str, Any]:
    """A pod that asks for no nvidia.com resource, only the claims it names."""
    pod = _pod({"cpu": "1"}, resourceClaims=list(entries))
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": e["name"]} for e in entries]
    return pod


def _run(client: _Client, pod: dict[str, Any], quota: QuotaLedger | None = None
         ) -> dict[str, Any]:
    hook, _ = _hook(client, _quota() if quota is None else quota)
    return asyncio.run(hook(_review(pod)))["response"]  # type: ignore[no-any-return]


def test_a_tenant_template_over_the_quota_is_denied_and_an_honest_one_admitted() -> None:
    client = _Client([_slice("n1", 16384)], templates={
        ("ns", "big"): _template("big", "30000Mi"), ("ns", "small"): _template("small", "2000Mi")})
    denied = _run(client, _claiming({"name": "g", "resourceClaimTemplateName": "big"}))
    assert not denied["allowed"], denied
    message = denied["status"]["message"]
    assert "exceeding resource quota" in message and "ResourceClaimTemplate ns/big" in message
    assert "30000 MiB" in message
    assert _run(client, _claiming({"name": "g", "resourceClaimTemplateName": "small"}))["allowed"]


def test_every_named_template_makes_a_claim_and_counts() -> None:
    """Two entries naming one template are two claims: 2 x 12000 MiB > 20000."""
    client = _Client([_slice("n1", 16384)], templates={("ns", "t"): _template("t", "12000Mi")})
    one = _claiming({"name": "a", "resourceClaimTemplateName": "t"})
    assert _run(client, one)["allowed"]
    two = _claiming({"name": "a", "resourceClaimTemplateName": "t"},
                    {"name": "b", "resourceClaimTemplateName": "t"})
    assert not _run(client, two)["allowed"]


def test_a_named_claim_already_counted_does_not_count_twice() -> None:
    """A claim of 12000 MiB already in the namespace's total (20000): a pod naming it
    (twice, even) adds nothing; over the limit it would be 24000."""
    client = _Client([_slice("n1", 16384)], [_claim("shared", {"memory": "12000Mi"})])
    pod = _claiming({"name": "a", "resourceClaimName": "shared"},
                    {"name": "b", "resourceClaimName": "shared"})
    assert _run(client, pod)["allowed"]


def test_a_named_claim_over_the_quota_is_denied() -> None:
    """The tenant's own claim of 30000 MiB is in the total already: a pod using it is
    refused (the namespace is over its quota)."""
    client = _Client([_slice("n1", 16384)], [_claim("huge", {"memory": "30000Mi"})])
    resp = _run(client, _claiming({"name": "a", "resourceClaimName": "huge"}))
    assert not resp["allowed"] and "ResourceClaim ns/huge" in resp["status"]["message"], resp


def test_a_pending_claim_with_a_small_last_entry_counts_its_largest() -> None:
    """A pending prioritized list not of hami's shape counts its largest entry (30000
    MiB) in the namespace's total, not its last (1 MiB): the namespace is over its
    quota and a pod naming the claim is refused."""
    listed = _claim("sly", {})
    listed["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.hami.io", "allocationMode": "ExactCount",
         "count": 1, "capacity": {"requests": {"memory": "30000Mi"}}},
        {"name": "tiny", "deviceClassName": "gpu.hami.io", "allocationMode": "ExactCount",
         "count": 1, "capacity": {"requests": {"memory": "1Mi"}}}]}]
    client = _Client([_slice("n1", 16384)], [listed])
    resp = _run(client, _claiming({"name": "a", "resourceClaimName": "sly"}))
    assert not resp["allowed"] and "(30000 MiB in use)" in resp["status"]["message"], resp


@pytest.mark.parametrize(("entry", "words"), [
    ({"name": "a", "resourceClaimTemplateName": "absent"},
     "ResourceClaimTemplate ns/absent (spec.resourceClaims a) does not exist"),
    ({"name": "a", "resourceClaimName": "absent"},
     "ResourceClaim ns/absent (spec.resourceClaims a) does not exist"),
    ({"name": "a", "resourceClaimTemplateName": "all"}, "allocationMode 'All'"),
    ({"name": "a", "resourceClaimTemplateName": "secret"}, "cannot read ResourceClaimTemplate"),
    ({"name": "a"}, "exactly one of resourceClaimName and resourceClaimTemplateName"),
])
def test_what_cannot_be_counted_is_denied_with_a_reason(entry: dict[str, str],
                                                          words: str) -> None:
    everything = _template("all", "1Mi")
    everything["spec"]["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"

    class _Forbidden(_Client):
        async def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
            if name == "secret":
                raise _api_error(403, "forbidden")
            return await super().get(res, name, namespace)

    client = _Forbidden([_slice("n1", 16384)], templates={("ns", "all"): everything})
    resp = _run(client, _claiming(entry))
    assert not resp["allowed"] and words in resp["status"]["message"], resp
    assert "GPU quota of namespace ns" in resp["status"]["message"]


def test_namespaces_without_a_gpu_quota_are_not_affected() -> None:
    """No quota: no quota check (no list), and a missing template is the API server's
    business; the template is read once, to tell whether its containers keep the rules of
    GPU containers (tests/integration/test_dra_own_claims_isolation.py)."""
    client = _Client([_slice("n1", 16384)])
    pod = _claiming({"name": "a", "resourceClaimTemplateName": "absent"})
    hook, seen = _hook(client, QuotaLedger())
    assert asyncio.run(hook(_review(pod)))["response"].get("fallback")
    assert seen and client.gets == [("ns", "absent")] and not client.lists
    malformed = _pod({"cpu": "1"}, resourceClaims="not a list")
    assert asyncio.run(hook(_review(malformed)))["response"].get("fallback")


def test_a_template_pre_made_under_hamis_name_is_refused_by_name() -> None:
    """The attacker's path: hami names a template after the hash of what it asks, so a
    tenant can create ``hami-gpu-<hash of 1000 MiB>`` asking 30000 MiB and wait for a
    GPU pod of 1000 MiB; the webhook must not reuse it."""
    name, ours = tr.template_for(tr.claim_spec(1, 1000, 0, []))
    forged = _template(name, "30000Mi")
    client = _Client([_slice("n1", 16384)], templates={("ns", name): forged})
    resp = _run(client, _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}), QuotaLedger())
    assert not resp["allowed"], resp
    assert f"ResourceClaimTemplate ns/{name}" in resp["status"]["message"]
    assert not client.created
    # the same content as hami's (as the API server stores it) is hami's template
    client.templates[("ns", name)] = {**ours, "metadata": {"name": name, "namespace": "ns"}}
    resp = _run(client, _pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}), QuotaLedger())
    assert resp["allowed"] and not client.created, resp


def _signed_pod(memory_mib: int, namespace: str = "ns") -> tuple[str, dict[str, Any]]:
    """What the webhook's answer makes of a GPU pod of ``memory_mib`` (another admission,
    e.g. with ``reinvocationPolicy: IfNeeded``): its template's name and the pod naming
    it, with the spec signed for ``namespace``."""
    from hami.dra import signedspecs

    name, template = tr.template_for(tr.claim_spec(1, memory_mib, 0, []))
    pod = _claiming({"name": "gpu-0", "resourceClaimTemplateName": name})
    pod["metadata"]["annotations"] = signedspecs.sign(
        signedspecs.process_keys().signing_key(), namespace, {name: template})
    return name, pod


def test_a_hami_template_not_made_yet_counts_its_signed_spec() -> None:
    """The template is created once the pod exists: at admission a pod naming a hami
    template that is not there yet is counted from the spec it carries signed."""
    _, fits = _signed_pod(2000)
    assert _run(_Client([_slice("n1", 16384)]), fits)["allowed"]
    name, over = _signed_pod(30000)
    resp = _run(_Client([_slice("n1", 16384)]), over)
    assert not resp["allowed"], resp
    assert "exceeding resource quota" in resp["status"]["message"]
    assert f"ResourceClaimTemplate ns/{name}" in resp["status"]["message"]
    assert "30000 MiB" in resp["status"]["message"]


def test_a_hami_template_name_without_a_valid_signature_is_not_found() -> None:
    """A tenant naming a hami template that does not exist, with no signature, one made
    for another namespace, or one whose spec was changed, is refused: nothing would
    create that template, and its size is unknown."""
    from hami.dra import signedspecs

    name, plain = _signed_pod(2000)
    plain["metadata"]["annotations"] = {}
    _, elsewhere = _signed_pod(2000, namespace="other")
    _, changed = _signed_pod(2000)
    bigger = tr.claim_spec(1, 30000, 0, [])
    changed["metadata"]["annotations"][signedspecs.SPECS_ANNOTATION] = json.dumps([bigger])
    for pod, why in ((plain, "no hami.io/dra-claim-templates-signature"),
                     (elsewhere, "signed for another namespace"),
                     (changed, "does not match its signature")):
        resp = _run(_Client([_slice("n1", 16384)]), pod)
        assert not resp["allowed"], resp
        message = resp["status"]["message"]
        assert f"ResourceClaimTemplate ns/{name}" in message and "does not exist" in message
        assert why in message, message
