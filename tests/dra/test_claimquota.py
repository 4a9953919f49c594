"""DRA webhook, namespace GPU quota: ResourceClaims and ResourceClaimTemplates checked
when they are created (:mod:`hami.dra.claimquota`), and the spec shape hami's own
translation writes (:func:`hami.dra.specshape.hami_shaped`). The API client is the
recording stub of ``test_webhook``; the real apiserver path (the webhook registered,
the resourceclaim controller making claims) is in tests/e2e/test_dra_claim_quota_e2e.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hami.core.quota import QuotaLedger
from hami.dra import translate as tr
from hami.dra.booking import (
    BookingError,
    admission_asks,
    claim_booking,
    strict_asks,
)
from hami.dra.specshape import hami_shaped
from tests.dra.test_webhook import _api_error, _claim, _Client, _hook, _slice
from tests.dra.test_webhook_named_claims import _quota, _template

CARD_MIB = 16384


def _exactly(memory: str | None, cores: str = "0", **extra: Any) -> dict[str, Any]:
    requests = {"cores": cores, **({"memory": memory} if memory else {})}
    return {"deviceClassName": "gpu.hami.io", "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": requests}, **extra}


def _tenant_claim(name: str, *entries: dict[str, Any], listed: bool = False) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "gpu"}
    if listed:
        request["firstAvailable"] = [{"name": f"e{i}", **e} for i, e in enumerate(entries)]
    else:
        (request["exactly"],) = entries
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [request]}}}


def _review(obj: dict[str, Any], operation: str = "CREATE", sub: str | None = None) -> bytes:
    request: dict[str, Any] = {
        "uid": "u2", "operation": operation, "namespace": "ns", "object": obj,
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]},
        "resource": {"group": "resource.k8s.io", "version": "v1",
                     "resource": obj["kind"].lower() + "s"}}
    if sub:
        request["subResource"] = sub
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": request}).encode()


def _run(client: _Client, obj: dict[str, Any], quota: QuotaLedger | None = None,
         **kw: Any) -> tuple[dict[str, Any], list[bytes]]:
    hook, seen = _hook(client, _quota() if quota is None else quota)
    return asyncio.run(hook(_review(obj, **kw)))["response"], seen


def _hamis(memory_mib: int, profiles: tuple[str, ...] = ()) -> dict[str, Any]:
    """The claim the resourceclaim controller makes from hami's template."""
    spec = tr.claim_spec(1, memory_mib, 10, [], profiles)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"generateName": "pod-gpu-0-", "namespace": "ns",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "pod",
                                              "uid": "1", "controller": True}]},
            "spec": spec}


def test_a_claim_over_what_is_left_is_denied_and_one_within_admitted() -> None:
    """12000 MiB in the namespace (limit 20000): 9000 more is refused, 8000 admitted."""
    client = _Client([_slice("n1", CARD_MIB)], [_claim("there", {"memory": "12000Mi"})])
    resp, seen = _run(client, _tenant_claim("big", _exactly("9000Mi")))
    assert not resp["allowed"] and not seen, resp
    message = resp["status"]["message"]
    assert "exceeding resource quota: namespace ns: ResourceClaim ns/big asks for 9000 MiB" \
        in message and "(12000 MiB in use)" in message, message
    resp, _ = _run(client, _tenant_claim("fits", _exactly("8000Mi")))
    assert resp["allowed"], resp


def test_a_template_is_checked_as_one_claim() -> None:
    """The delete-and-recreate path: a template created again under a checked name,
    asking more than is left, is refused when created."""
    client = _Client([_slice("n1", CARD_MIB)], [_claim("there", {"memory": "12000Mi"})])
    resp, _ = _run(client, _template("t", "9000Mi"))
    assert not resp["allowed"], resp
    assert "ResourceClaimTemplate ns/t asks for 9000 MiB" in resp["status"]["message"]
    assert "each pod naming the template makes one claim" in resp["status"]["message"]
    assert _run(client, _template("t", "8000Mi"))[0]["allowed"]


def test_a_tenant_prioritized_list_counts_its_largest_entry() -> None:
    """[15000 MiB, 1 MiB] with 6000 MiB in use: counted 15000 (kube-scheduler may pick
    the first), so refused; hami's own list counts its shared-card entry."""
    client = _Client([_slice("n1", CARD_MIB)], [_claim("there", {"memory": "6000Mi"})])
    sly = _tenant_claim("sly", _exactly("15000Mi"), _exactly("1Mi"), listed=True)
    resp, _ = _run(client, sly)
    assert not resp["allowed"] and "asks for 15000 MiB" in resp["status"]["message"], resp


def test_the_controllers_claim_from_hamis_template_is_counted_as_its_pod_was() -> None:
    """hami's MIG list (instances first, then the shared card of 5000 MiB): counted
    5000 MiB like the pod, not a whole card per MIG entry (a strict reading would refuse
    it: 6000 + 16384 > 20000). It is checked against the claims there now: once they
    took the room (pods admitted in the same instant), it is refused."""
    claim = _hamis(5000, ("1g.10gb", "3g.20gb"))
    assert hami_shaped(claim["spec"])
    assert strict_asks(claim["spec"], CARD_MIB, "c") == (CARD_MIB, 10)
    assert admission_asks(claim["spec"], CARD_MIB, "c") == (5000, 10)
    client = _Client([_slice("n1", CARD_MIB)], [_claim("there", {"memory": "6000Mi"})])
    resp, _ = _run(client, claim)
    assert resp["allowed"], resp
    client.claims.append(_claim("racer", {"memory": "10000Mi"}))
    resp, _ = _run(client, claim)
    assert not resp["allowed"], resp
    assert "ResourceClaim ns/pod-gpu-0-<generated> asks for 5000 MiB" in resp["status"]["message"]


@pytest.mark.parametrize("spec", [
    tr.claim_spec(1, 5000, 30, tr.selectors({"nvidia.com/use-gputype": "A100"}),
                  ["1g.10gb", "3g.20gb"]),
    tr.claim_spec(2, 2048, 10, tr.selectors({"nvidia.com/nouse-gpuuuid": "GPU-1,GPU-2"})),
    tr.claim_spec(1, 0, 0, []), tr.claim_spec(3, 1536, 100, []),
])
def test_hamis_shapes_are_recognised_also_as_the_api_server_stores_them(
        spec: dict[str, Any]) -> None:
    assert hami_shaped(spec)
    stored = json.loads(json.dumps(spec).replace('"2048Mi"', '"2Gi"'))
    assert hami_shaped(stored)


def test_a_list_only_looking_like_hamis_is_read_strictly() -> None:
    """The tenant's MIG-like list whose instance entry asks more, or whose shared entry is
    not last, or that carries a second request: not hami's, counted strictly."""
    spec = tr.claim_spec(1, 1000, 0, [], ["1g.10gb"])
    first = spec["devices"]["requests"][0]["firstAvailable"]
    bigger = json.loads(json.dumps(spec))
    bigger["devices"]["requests"][0]["firstAvailable"][0]["capacity"] = {
        "requests": {"memory": "30000Mi"}}
    swapped = json.loads(json.dumps(spec))
    swapped["devices"]["requests"][0]["firstAvailable"] = first[::-1]
    second = json.loads(json.dumps(spec))
    second["devices"]["requests"].append({"name": "more", "exactly": _exactly("9000Mi")})
    for other in (bigger, swapped, second):
        assert not hami_shaped(other)
    assert admission_asks(bigger, CARD_MIB, "c") == (30000, 0)
    assert admission_asks(second, CARD_MIB, "c") == (CARD_MIB + 9000, 0)


def test_what_cannot_be_counted_is_denied_with_the_reason() -> None:
    client = _Client([_slice("n1", CARD_MIB)])
    everything = _tenant_claim("all", _exactly("1Mi", allocationMode="All"))
    resp, _ = _run(client, everything)
    assert not resp["allowed"], resp
    assert "cannot check ResourceClaim ns/all against the GPU quota" in resp["status"]["message"]
    assert "allocationMode 'All'" in resp["status"]["message"]
    with pytest.raises(BookingError):
        admission_asks(everything["spec"], CARD_MIB, "c")


def test_claims_of_other_classes_updates_and_status_are_allowed() -> None:
    client = _Client([_slice("n1", CARD_MIB)], [_claim("huge", {"memory": "30000Mi"})])
    nic = _tenant_claim("nic", _exactly("9000Mi") | {"deviceClassName": "nic.example.com"})
    assert _run(client, nic)[0]["allowed"]
    big = _tenant_claim("big", _exactly("9000Mi"))
    assert _run(client, big, operation="UPDATE")[0]["allowed"]
    assert _run(client, big, sub="status")[0]["allowed"]
    assert _run(client, big, operation="DELETE")[0]["allowed"]
    assert not _run(client, big)[0]["allowed"]


def test_namespaces_without_a_gpu_quota_make_no_api_call() -> None:
    client = _Client([_slice("n1", CARD_MIB)])
    resp, seen = _run(client, _tenant_claim("big", _exactly("90000Mi")), QuotaLedger())
    assert resp["allowed"] and not seen and not client.lists and not client.gets


def test_an_unreadable_namespace_refuses_the_claim() -> None:
    class _Broken(_Client):
        def list(self, res: Any, namespace: str | None = None, labels: Any = None) -> Any:
            if res.__name__ == "ResourceClaim":
                raise _api_error(403, "forbidden")
            return super().list(res, namespace, labels)

    resp, _ = _run(_Broken([_slice("n1", CARD_MIB)]), _tenant_claim("c", _exactly("1Mi")))
    assert not resp["allowed"] and "403 forbidden" in resp["status"]["message"], resp


def test_the_total_counts_hamis_list_by_its_shared_entry() -> None:
    """The namespace total and the check agree on hami's shape (5000 MiB, not a card)."""
    claim = _hamis(5000, ("1g.10gb",))
    assert claim_booking(claim, CARD_MIB) == (5000, 10)
