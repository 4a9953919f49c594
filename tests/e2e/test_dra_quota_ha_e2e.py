"""DRA mode's namespace GPU quota when claims arrive together, with two scheduler
replicas behind one Service (the chart's HA setting), on the real control plane: two
``hami scheduler --dra-mode`` processes serve ``/webhook`` through one round-robin
forwarder that the kube-apiserver calls for ResourceClaim CREATE; the quota is a real
ResourceQuota. Ten claims of 12000 MiB created at the same instant under 20000 MiB: one
is admitted (without the per-namespace reservation Lease, all ten were).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from hami.dra.reservations import ANNOTATION, QuotaReservations
from hami.dra.slices import DRIVER
from hami.testing.controlplane import ControlPlane

from .drabed import DRA_ARGS, dra_bed, wait_for
from .hami_harness import HamiProcess

pytestmark = pytest.mark.e2e

NS = "quotaha"
LIMIT_MIB = 20000
CLAIM_MIB = 12000
LEASES_NS = "kube-system"  # the replicas run without POD_NAMESPACE


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Control plane + two ``hami scheduler --dra-mode`` replicas registered, through one
    round-robin forwarder, as the webhook for claims + a 20000 MiB GPU ResourceQuota."""
    with dra_bed(tmp_path_factory.mktemp("k8s-quotaha"), controller_manager=False,
                 namespace=NS, quota_mib=LIMIT_MIB, hami_args=DRA_ARGS,
                 hami_names=("hami-0", "hami-1"), webhook="hami-quotaha",
                 webhooks=("claims",)) as dra:
        yield {"cp": dra.cp, "client": dra.client, "replicas": dra.hamis,
               "forwarder": dra.forwarder}


def _claim(name: str, memory_mib: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": f"{memory_mib}Mi"}}}}]}}}


def _refuses(replica: HamiProcess) -> bool:
    """The replica's webhook refuses a claim over the quota (it has read the quota)."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "probe", "operation": "CREATE", "namespace": NS,
                          "kind": {"group": "resource.k8s.io", "version": "v1",
                                   "kind": "ResourceClaim"},
                          "object": _claim("probe", 3 * LIMIT_MIB)}}
    try:
        code, body = replica.post("/webhook", json.dumps(review).encode(), timeout_s=10)
    except OSError:  # not listening yet
        return False
    return code == 200 and json.loads(body)["response"]["allowed"] is False


def _apiserver_refuses(client: Any) -> bool:
    """A server-side dry-run create (nothing stored, no reservation: it is refused) of a
    claim over the quota is refused by the webhook, not admitted unchecked."""
    from lightkube import ApiError, codecs

    try:
        client.create(codecs.from_dict(_claim("probe", 3 * LIMIT_MIB)), dry_run=True)
    except ApiError as err:
        return "exceeding resource quota" in str(err.status.message)
    return False


def _create_at_once(cp: ControlPlane, names: list[str]) -> dict[str, str]:
    """Create one claim per name from its own thread and client, all released by one
    barrier: name -> "created" or the refusal."""
    from lightkube import ApiError, codecs

    clients = [cp.client() for _ in names]
    barrier = threading.Barrier(len(names))
    out: dict[str, str] = {}

    def create(name: str, client: Any) -> None:
        barrier.wait()
        try:
            client.create(codecs.from_dict(_claim(name, CLAIM_MIB)))
            out[name] = "created"
        except ApiError as exc:
            out[name] = str(exc.status.message)

    threads = [threading.Thread(target=create, args=(n, c)) for n, c in zip(names, clients, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_ten_claims_at_once_under_a_quota_for_one_admit_one(bed: dict[str, Any]) -> None:
    from lightkube.resources.coordination_v1 import Lease
    from lightkube.resources.resource_v1 import ResourceClaim

    client, replicas = bed["client"], bed["replicas"]
    for replica in replicas:  # each replica has read the ResourceQuota
        wait_for(lambda r=replica: _refuses(r), 60, f"{replica.name} enforces the quota")
    # ... and the apiserver calls them: its webhook informer has the configuration
    wait_for(lambda: _apiserver_refuses(client), 60, "the apiserver calls the claims webhook")
    served_before = dict(bed["forwarder"].served)

    names = [f"c{i}" for i in range(10)]
    results = _create_at_once(bed["cp"], names)
    admitted = sorted(n for n, r in results.items() if r == "created")
    stored = {c.metadata.name for c in client.list(ResourceClaim, namespace=NS)}
    assert set(admitted) == stored
    assert len(admitted) * CLAIM_MIB <= LIMIT_MIB, results
    assert len(admitted) == 1, results
    refusals = [r for r in results.values() if r != "created"]
    assert all("exceeding resource quota" in r for r in refusals), refusals
    # both replicas answered reviews of this burst
    served = {k: v - served_before.get(k, 0) for k, v in bed["forwarder"].served.items()}
    assert all(served.get(r.name, 0) > 0 for r in replicas), served
    lease = client.get(Lease, QuotaReservations.lease_name(NS), namespace=LEASES_NS)
    assert ANNOTATION in (lease.metadata.annotations or {})

    # a later check lists the admitted claim and drops its reservation: deleted, the
    # claim's room is free again at once, for exactly one claim again
    assert "exceeding resource quota" in _create_at_once(bed["cp"], ["late"])["late"]
    client.delete(ResourceClaim, admitted[0], namespace=NS)
    wait_for(lambda: not list(client.list(ResourceClaim, namespace=NS)), 30, "claim gone")
    again = _create_at_once(bed["cp"], [f"d{i}" for i in range(4)])
    assert sum(r == "created" for r in again.values()) == 1, again
