"""DRA mode's namespace GPU quota books a pod's claims as extender mode books the pod
(init containers collapsed, issue 30 item 2), on the real control plane: a real ``hami
scheduler --dra-mode`` process is the webhook the kube-apiserver calls (pods through a
mutating webhook, ResourceClaims and ResourceClaimTemplates through a validating one, as
the chart registers them), the quota is a real ResourceQuota, the claims are made by the
real resourceclaim controller of kube-controller-manager running as
``system:kube-controller-manager`` (a cluster without
``--use-service-account-credentials``) and allocated by the default kube-scheduler from
a published slice (no kubelet: pods are bound, not run).

The quota is 15000 MiB. A pod with a 10000 MiB GPU init container and a 10000 MiB GPU app
container books 10000 MiB in extender mode (the peak of the init containers or the sum of
the app containers); counted claim by claim its two claims are 20000 MiB, and the second
was refused (the pod never started).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from hami.dra import podclaims
from hami.dra.reservations import TTL_S, QuotaReservations
from hami.dra.slices import DRIVER
from hami.testing.kubeclients import admin_client

from .drabed import DRA_ARGS, Cards, dra_bed, wait_for
from .hami_harness import gpu_pod

pytestmark = pytest.mark.e2e

NS = "initquota"
LIMIT_MIB = 15000
CARD_MIB = 16384
LEASES_NS = "kube-system"  # the scheduler runs without POD_NAMESPACE


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Control plane + controller manager (as ``system:kube-controller-manager``) + one
    node with two published cards of 16384 MiB + hami scheduler --dra-mode as the webhook
    + a ResourceQuota of 15000 MiB of GPU memory in :data:`NS` + a tenant's client (a
    user hami does not trust to create pods' claims)."""
    work = tmp_path_factory.mktemp("k8s-initquota")
    # the apiserver calls both webhooks (the pod webhook's wait) before any test
    with dra_bed(work, manager_user="system:kube-controller-manager", namespace=NS,
                 nodes={"initquota-0": Cards(2, CARD_MIB)}, quota_mib=LIMIT_MIB,
                 hami_args=DRA_ARGS, webhook="hami-initquota", webhooks=("pods", "claims"),
                 serving_namespace="default") as dra:
        try:
            tenant = admin_client(dra.cp.client_kubeconfig(
                work / "tenant.kubeconfig", "tenant", ["system:masters"]), NS)
            _BED.update(cp=dra.cp, client=dra.client, tenant=tenant, hami=dra.hami)
            # ... and hami knows the quota
            _wait(lambda: _claims_checked(dra.client), 60,
                  "the claims webhook enforces the quota")
            yield _BED
        finally:
            _BED.clear()


#: The bed, for :func:`_state` in failure messages.
_BED: dict[str, Any] = {}


def _state() -> str:
    """The namespace's claims and Warning Events and the scheduler's log tail."""
    from lightkube.resources.core_v1 import Event
    from lightkube.resources.resource_v1 import ResourceClaim

    if not _BED:
        return ""
    client = _BED["client"]
    claims = [(c.metadata.name, [o.name for o in c.metadata.ownerReferences or []],
               bool(c.status and c.status.allocation))
              for c in client.list(ResourceClaim, namespace=NS)]
    events = [(e.involvedObject.name, e.reason, e.message)
              for e in client.list(Event, namespace=NS) if e.type == "Warning"]
    log = _BED["hami"].log_path.read_text(errors="replace")[-3000:]
    return f"claims {claims}; warnings {events}; hami log tail:\n{log}"


_wait = partial(wait_for, state=_state)


def _claims_checked(client: Any) -> bool:
    """True once a dry-run claim over the quota is refused by hami (nothing stored)."""
    from lightkube import ApiError, codecs

    probe = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "probe", "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
                 "capacity": {"requests": {"memory": f"{LIMIT_MIB + 1}Mi"}}}}]}}}
    try:
        client.create(codecs.from_dict(probe), dry_run=True)
    except ApiError as err:
        return "exceeding resource quota" in str(err.status.message)
    return False


def _init_pod(name: str, init_mib: int, app_mib: int) -> dict[str, Any]:
    """A GPU pod whose init container and app container each ask ``*_mib`` of one card."""
    doc = gpu_pod(name, memory_mib=app_mib, namespace=NS)
    init = json.loads(json.dumps(doc["spec"]["containers"][0]))
    init["name"] = "prepare"
    init["resources"]["limits"]["nvidia.com/gpumem"] = str(init_mib)
    doc["spec"]["initContainers"] = [init]
    return doc


def _claims_of(client: Any, pod: str) -> list[dict[str, Any]]:
    from lightkube.resources.resource_v1 import ResourceClaim

    out = []
    for c in client.list(ResourceClaim, namespace=NS):
        doc = c.to_dict()
        if [o.get("name") for o in doc["metadata"].get("ownerReferences") or []] == [pod]:
            out.append(doc)
    return out


def _running(client: Any, pod: str, claims: int) -> list[dict[str, Any]] | None:
    """The pod's claims once it has ``claims`` claims, all allocated, and is bound."""
    from lightkube.resources.core_v1 import Pod

    found = _claims_of(client, pod)
    if len(found) != claims or not all((c.get("status") or {}).get("allocation")
                                       for c in found):
        return None
    return found if client.get(Pod, pod, namespace=NS).spec.nodeName else None


def _refused(client: Any, obj: dict[str, Any]) -> str:
    from lightkube import ApiError, codecs

    with pytest.raises(ApiError) as err:
        client.create(codecs.from_dict(obj))
    return str(err.value.status.message)


def _recorded(client: Any) -> list[podclaims.PodClaimRecord]:
    from lightkube.resources.coordination_v1 import Lease

    lease = client.get(Lease, QuotaReservations.lease_name(NS), namespace=LEASES_NS)
    return podclaims.parse((lease.metadata.annotations or {}).get(podclaims.ANNOTATION))


def _records(client: Any) -> set[str]:
    return {r.claim_uid for r in _recorded(client)}


def _delete_pod(client: Any, name: str) -> None:
    from lightkube.resources.core_v1 import Pod

    client.delete(Pod, name, namespace=NS)
    _wait(lambda: not _claims_of(client, name), 120, f"{name}'s claims collected")


def test_init_container_claims_book_as_extender_mode_books_the_pod(
        bed: dict[str, Any]) -> None:
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod

    client = bed["client"]
    # 10000 MiB init + 10000 MiB app under 15000: admitted (it books 10000), both claims
    # made by the controller and admitted, allocated, the pod bound
    client.create(codecs.from_dict(_init_pod("both", 10000, 10000)))
    claims = _wait(lambda: _running(client, "both", 2), 120,
                   "both's two claims allocated and the pod bound")
    assert {c["metadata"]["uid"] for c in claims} <= _records(client)

    # A second pod that the collapsed charge leaves no room for is refused (10000 +
    # 6000 > 15000); one that fits into what is left (10000 + 5000) runs.
    message = _refused(client, gpu_pod("over", memory_mib=6000, namespace=NS))
    assert "exceeding resource quota" in message and "10000" in message, message
    client.create(codecs.from_dict(gpu_pod("fits", memory_mib=5000, namespace=NS)))
    _wait(lambda: _running(client, "fits", 1), 120, "fits' claim allocated, pod bound")
    assert client.get(Pod, "both", namespace=NS).spec.nodeName
    _delete_pod(client, "fits")


def test_a_tenants_claim_with_a_forged_pod_owner_counts_in_full(
        bed: dict[str, Any]) -> None:
    """The tenant's claim names pod "both" as its controller owner and its init entry in
    the resourceclaim controller's annotation: booked under the pod it would add nothing
    (its 5000 MiB is below the pod's 10000 MiB peak), counted in full it does not fit
    (10000 + 6000 > 15000). A pod using "both"'s init claim by name would use it beside
    "both"'s app claim: that claim then counts in full, and does not fit either."""
    from lightkube.resources.core_v1 import Pod

    client, tenant = bed["client"], bed["tenant"]
    both = client.get(Pod, "both", namespace=NS)
    assert both.spec.nodeName, "the first test runs first"
    forged = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "forged", "namespace": NS,
                     "annotations": {podclaims.POD_CLAIM_NAME: "gpu-0"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "both",
                                          "uid": both.metadata.uid, "controller": True}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "6000Mi"}}}}]}}}
    message = _refused(tenant, forged)
    assert "exceeding resource quota" in message and "asks for 6000 MiB" in message, message

    (init_claim,) = [c for c in _claims_of(client, "both")
                     if c["metadata"]["annotations"][podclaims.POD_CLAIM_NAME] == "gpu-0"]
    sharer = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "sharer", "namespace": NS},
              "spec": {"terminationGracePeriodSeconds": 0,
                       "resourceClaims": [{"name": "g", "resourceClaimName":
                                           init_claim["metadata"]["name"]}],
                       "containers": [{"name": "c", "image": "pause",
                                       "resources": {"claims": [{"name": "g"}]}}]}}
    message = _refused(tenant, sharer)
    assert "exceeding resource quota" in message, message


def test_a_pod_created_again_books_once(bed: dict[str, Any]) -> None:
    """Deleted and created again (a new UID, new claims), the pod runs again; once a
    claim is admitted after the old claims are gone, the Lease records exactly the
    claims that exist."""
    from lightkube import codecs
    from lightkube.resources.resource_v1 import ResourceClaim

    client = bed["client"]
    old = {c["metadata"]["uid"] for c in _claims_of(client, "both")}
    assert len(old) == 2
    _delete_pod(client, "both")
    client.create(codecs.from_dict(_init_pod("both", 10000, 10000)))
    new = _wait(lambda: _running(client, "both", 2), 120, "both runs again")
    assert not old & {c["metadata"]["uid"] for c in new}
    client.create(codecs.from_dict(gpu_pod("after", memory_mib=5000, namespace=NS)))
    (after,) = _wait(lambda: _running(client, "after", 1), 120,
                     "after's claim allocated, pod bound")
    stored = {c.metadata.uid for c in client.list(ResourceClaim, namespace=NS)}
    records = {r.claim_uid: r for r in _recorded(client)}
    assert stored <= set(records), (stored, records)
    # the write that recorded after's claim dropped every record of a claim that is gone,
    # except those admitted in the TTL before it (not stored yet, for all it knew)
    written = records[after["metadata"]["uid"]].at
    for uid, r in records.items():
        assert uid in stored or written - r.at < TTL_S, (r, stored)
