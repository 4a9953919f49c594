"""The namespace GPU quota under concurrency (:mod:`hami.dra.reservations`): two webhook
replicas share one API store (a lightkube-level stub that keeps claims and Leases and
answers a replace carrying an old ``resourceVersion`` with 409, as the API server does);
claims are reviewed concurrently and stored after admission. The real control plane path
is tests/e2e/test_dra_quota_ha_e2e.py."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from hami.core.quota import QuotaLedger
from hami.devices.registry import make_config
from hami.dra import reservations as rs
from hami.dra.webhook import DraWebhook
from tests.dra.test_webhook import _api_error, _Listing, _Obj, _slice

LIMIT_MIB = 20000


class _Store:
    """The API server's objects: claims of namespace ns, Leases by name."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.conflicts = 0


class _SlowListing(_Listing):
    async def __aiter__(self) -> Any:
        await asyncio.sleep(0)
        for d in self.docs:
            yield _Obj(d)


class _Api:
    """One replica's lightkube ``AsyncClient`` on the shared :class:`_Store`; every call
    yields to the event loop first, as a request would."""

    def __init__(self, store: _Store) -> None:
        self.store = store

    def list(self, res: Any, namespace: str | None = None, labels: Any = None) -> _Listing:
        if res.__name__ == "ResourceSlice":
            return _Listing([_slice("n1", 16384)])
        return _SlowListing([copy.deepcopy(c) for c in self.store.claims.values()])

    async def watch(self, res: Any, **kw: Any) -> Any:
        await asyncio.Event().wait()  # nothing changes
        yield None

    async def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
        await asyncio.sleep(0)
        doc = self.store.leases.get(name)
        if doc is None:
            raise _api_error(404)
        return res.from_dict(copy.deepcopy(doc))

    async def create(self, obj: Any, namespace: str | None = None) -> Any:
        await asyncio.sleep(0)
        if obj.metadata.name in self.store.leases:
            raise _api_error(409)
        self.store.rv += 1
        doc = obj.to_dict()
        doc["metadata"]["resourceVersion"] = str(self.store.rv)
        self.store.leases[obj.metadata.name] = doc
        return type(obj).from_dict(copy.deepcopy(doc))

    async def replace(self, obj: Any, namespace: str | None = None) -> Any:
        await asyncio.sleep(0)
        doc = obj.to_dict()
        held = self.store.leases[obj.metadata.name]
        if doc["metadata"].get("resourceVersion") != held["metadata"]["resourceVersion"]:
            self.store.conflicts += 1
            raise _api_error(409, "the object has been modified")
        self.store.rv += 1
        doc["metadata"]["resourceVersion"] = str(self.store.rv)
        self.store.leases[obj.metadata.name] = doc
        return obj


def _hook(store: _Store, reserve: bool = True) -> DraWebhook:
    quota = QuotaLedger(make_config().registry["NVIDIA"].resource_names())
    quota.set_quota("ns", "gpu", {"limits.nvidia.com/gpumem": LIMIT_MIB})
    api = _Api(store)
    return DraWebhook(api, make_config(), lambda b: {"response": {"allowed": True}}, quota,
                      reservations=rs.QuotaReservations(api, "hami") if reserve else None)


def _claim(name: str, memory_mib: int, pod_uid: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if pod_uid:  # as the resourceclaim controller makes it: a generated name
        meta = {"generateName": f"{name}-", "namespace": "ns",
                "annotations": {rs.POD_CLAIM_NAME: "gpu-0"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                                     "uid": pod_uid, "controller": True}]}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.hami.io", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": f"{memory_mib}Mi"}}}}]}}}


def _review(claim: dict[str, Any], uid: str) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "operation": "CREATE", "namespace": "ns",
                                   "kind": {"group": "resource.k8s.io", "version": "v1",
                                            "kind": "ResourceClaim"},
                                   "object": claim}}).encode()


async def _burst(hooks: list[DraWebhook], store: _Store, claims: list[dict[str, Any]]
                 ) -> list[bool]:
    """Review every claim at once (alternating replicas); each admitted one is stored
    (under a generated name when it has none) after its review, as the API server does."""

    async def one(i: int, claim: dict[str, Any]) -> bool:
        resp = (await hooks[i % len(hooks)](_review(claim, f"r{i}")))["response"]
        if resp["allowed"]:
            stored = copy.deepcopy(claim)
            stored["metadata"].setdefault("name", f"{claim['metadata'].get('generateName')}x{i}")
            store.claims[stored["metadata"]["name"]] = stored
        return bool(resp["allowed"])

    return list(await asyncio.gather(*(one(i, c) for i, c in enumerate(claims))))


def test_ten_claims_at_once_on_two_replicas_admit_what_fits() -> None:
    store = _Store()
    hooks = [_hook(store), _hook(store)]
    admitted = asyncio.run(_burst(hooks, store, [_claim(f"c{i}", 12000) for i in range(10)]))
    assert sum(admitted) == 1 and store.conflicts > 0
    # the generated names of the resourceclaim controller: matched by pod and entry
    store2 = _Store()
    hooks2 = [_hook(store2), _hook(store2)]
    pods = [_claim(f"p{i}", 6000, pod_uid=f"uid-{i}") for i in range(10)]
    assert sum(asyncio.run(_burst(hooks2, store2, pods))) == 3


def test_without_reservations_the_burst_overruns() -> None:
    """What happened before: each check lists the claims stored so far."""
    store = _Store()
    hooks = [_hook(store, reserve=False), _hook(store, reserve=False)]
    admitted = asyncio.run(_burst(hooks, store, [_claim(f"c{i}", 12000) for i in range(10)]))
    assert sum(admitted) == 10


def test_a_listed_claim_drops_its_reservation_and_expired_ones_stop_counting() -> None:
    store = _Store()
    hook = _hook(store)

    async def scenario() -> None:
        assert await _burst([hook], store, [_claim("a", 12000)]) == [True]
        # a refused check lists claim a and drops its reservation
        assert await _burst([hook], store, [_claim("b", 12000)]) == [False]
        (lease,) = store.leases.values()
        assert rs.parse(lease["metadata"]["annotations"][rs.ANNOTATION]) == []
        del store.claims["a"]
        assert await _burst([hook], store, [_claim("c", 12000)]) == [True]
        # a reservation whose claim never appears (refused later by the API server)
        # counts for the TTL, then no more
        hook.reservations.clock = lambda: 10**10  # type: ignore[union-attr]
        store.claims.clear()
        assert await _burst([hook], store, [_claim("d", 12000)]) == [True]

    asyncio.run(scenario())


def test_a_malformed_lease_annotation_counts_as_no_reservation() -> None:
    assert rs.parse("not json") == [] and rs.parse('[["k", "x", 1, 2], 3]') == []
    assert rs.parse('[["k", 1, 2, 3.5]]') == [rs.Reservation("k", 1, 2, 3.5)]
