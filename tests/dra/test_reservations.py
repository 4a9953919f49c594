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

import pytest

from hami.core.quota import QuotaLedger
from hami.devices.registry import make_config
from hami.dra import podclaims
from hami.dra import reservations as rs
from hami.dra.webhook import DraWebhook
from tests.dra.test_webhook import _api_error, _Listing, _Obj, _slice

LIMIT_MIB = 20000


class _Store:
    """The API server's objects: claims of namespace ns, Leases by name."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
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
        if res.__name__ == "Pod":
            return _SlowListing([copy.deepcopy(p) for p in self.store.pods])
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


def _init_pod(uid: str) -> dict[str, Any]:
    """A translated pod: init container on entry gpu-0, app container on gpu-1."""
    return {"metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid},
            "spec": {"resourceClaims": [
                {"name": "gpu-0", "resourceClaimTemplateName": "hami-gpu-a"},
                {"name": "gpu-1", "resourceClaimTemplateName": "hami-gpu-a"}],
                "initContainers": [{"name": "i", "resources": {"claims": [{"name": "gpu-0"}]}}],
                "containers": [{"name": "m", "resources": {"claims": [{"name": "gpu-1"}]}}]}}


def _controller_claim(pod_uid: str, entry: str, memory_mib: int, user: str) -> dict[str, Any]:
    """A claim as a validating webhook sees the resourceclaim controller's CREATE: a
    generated name and the server's UID already set."""
    claim = _claim(f"pod-{pod_uid}-{entry}", memory_mib, pod_uid=pod_uid)
    claim["metadata"]["annotations"][rs.POD_CLAIM_NAME] = entry
    claim["metadata"]["name"] = f"pod-{pod_uid}-{entry}-x"
    claim["metadata"]["uid"] = f"{pod_uid}-{entry}"
    claim["user"] = user  # taken out into the review's userInfo by _user_burst
    return claim


async def _user_burst(hooks: list[DraWebhook], store: _Store, claims: list[dict[str, Any]]
                      ) -> list[bool]:
    """:func:`_burst` with each review's ``userInfo`` from the claim's ``user``."""

    async def one(i: int, claim: dict[str, Any]) -> bool:
        claim = copy.deepcopy(claim)
        user = claim.pop("user")
        body = json.loads(_review(claim, f"r{i}"))
        body["request"]["userInfo"] = {"username": user}
        resp = (await hooks[i % len(hooks)](json.dumps(body).encode()))["response"]
        if resp["allowed"]:
            store.claims[claim["metadata"]["name"]] = claim
        return bool(resp["allowed"])

    return list(await asyncio.gather(*(one(i, c) for i, c in enumerate(claims))))


CONTROLLER = "system:kube-controller-manager"


def test_a_pods_init_and_app_claims_book_as_the_pod_on_two_replicas() -> None:
    """Quota 20000: two pods, each a 12000 MiB init and a 12000 MiB app claim made by the
    controller, all four reviewed at once on two replicas. Each pod books 12000 (the
    extender's collapse), so one pod's two claims are admitted and the other's refused;
    counted claim by claim only one claim of 12000 fit."""
    store = _Store()
    store.pods = [_init_pod("p1"), _init_pod("p2")]
    hooks = [_hook(store), _hook(store)]
    claims = [_controller_claim(p, e, 12000, CONTROLLER)
              for e in ("gpu-0", "gpu-1") for p in ("p1", "p2")]
    admitted = asyncio.run(_user_burst(hooks, store, claims))
    owners = {c["metadata"]["ownerReferences"][0]["uid"]
              for c, ok in zip(claims, admitted, strict=True) if ok}
    assert sum(admitted) == 2 and len(owners) == 1, admitted
    (lease,) = store.leases.values()
    recorded = {r.claim_uid for r in podclaims.parse(
        lease["metadata"]["annotations"][podclaims.ANNOTATION])}
    assert recorded == {c["metadata"]["uid"] for c, ok in zip(claims, admitted, strict=True)
                        if ok}


def test_the_same_claims_from_a_tenant_count_each_in_full() -> None:
    """The same four claims, owners and annotations, created by a user hami does not
    trust: one fits (12000 of 20000), as before; and with one pod's claims booked, a
    tenant's claim forging that pod's init entry counts in full."""
    store = _Store()
    store.pods = [_init_pod("p1"), _init_pod("p2")]
    hooks = [_hook(store), _hook(store)]
    claims = [_controller_claim(p, e, 12000, "alice")
              for e in ("gpu-0", "gpu-1") for p in ("p1", "p2")]
    assert sum(asyncio.run(_user_burst(hooks, store, claims))) == 1

    store = _Store()
    store.pods = [_init_pod("p1")]
    hook = _hook(store)
    ours = [_controller_claim("p1", e, 12000, CONTROLLER) for e in ("gpu-0", "gpu-1")]
    assert asyncio.run(_user_burst([hook], store, ours)) == [True, True]
    forged = _controller_claim("p1", "gpu-0", 9000, "alice")
    forged["metadata"].update(name="forged", uid="forged-uid")
    assert asyncio.run(_user_burst([hook], store, [forged])) == [False]
    # counted in full, what is left still takes a claim of 8000 (12000 + 8000)
    fits = _controller_claim("p1", "gpu-0", 8000, "alice")
    fits["metadata"].update(name="fits", uid="fits-uid")
    assert asyncio.run(_user_burst([hook], store, [fits])) == [True]


def test_a_template_is_checked_against_the_pods_booking() -> None:
    """With a pod's 10000 MiB init and app claims booked as the pod (10000 of 15000), a
    template of 5000 MiB fits (each pod naming it makes one claim); 6000 does not."""
    store = _Store()
    store.pods = [_init_pod("p1")]
    hook = _hook(store)
    hook.quota.set_quota("ns", "gpu", {"limits.nvidia.com/gpumem": 15000})  # type: ignore[union-attr]
    ours = [_controller_claim("p1", e, 10000, CONTROLLER) for e in ("gpu-0", "gpu-1")]
    assert asyncio.run(_user_burst([hook], store, ours)) == [True, True]

    def template(memory_mib: int) -> bytes:
        spec = _claim("t", memory_mib)["spec"]
        body = json.loads(_review(_claim("t", memory_mib), "rt"))
        body["request"]["kind"]["kind"] = "ResourceClaimTemplate"
        body["request"]["object"] = {"metadata": {"name": "t", "namespace": "ns",
                                                  "uid": "t-uid"}, "spec": {"spec": spec}}
        return json.dumps(body).encode()

    assert asyncio.run(hook(template(5000)))["response"]["allowed"]
    assert not asyncio.run(hook(template(6000)))["response"]["allowed"]


@pytest.mark.parametrize("now", [1765043212.0, 1765043212.1, 1765043212.125])
def test_a_record_the_lease_has_no_room_for_books_its_claim_in_full(monkeypatch: Any,
                                                                    now: float) -> None:
    """With the Lease's records full, the controller's claim is checked and booked
    each in full (the pod's second claim of 12000 does not fit 20000 then). The room is
    one record at its longest, whatever the clock reads: a time written short (``.0``)
    makes a record shorter, and two of those must still not fit."""
    longest = podclaims.dump([podclaims.PodClaimRecord("p1-gpu-0", "p1", "gpu-0",
                                                       1765043212.125)])
    monkeypatch.setattr(podclaims, "MAX_RECORDS_BYTES", len(longest))
    store = _Store()
    store.pods = [_init_pod("p1")]
    hook = _hook(store)
    hook.reservations.clock = lambda: now  # type: ignore[union-attr]
    ours = [_controller_claim("p1", e, 12000, CONTROLLER) for e in ("gpu-0", "gpu-1")]
    assert asyncio.run(_user_burst([hook], store, ours[:1])) == [True]
    assert asyncio.run(_user_burst([hook], store, ours[1:])) == [False]
    (lease,) = store.leases.values()
    assert [r.claim_uid for r in podclaims.parse(
        lease["metadata"]["annotations"][podclaims.ANNOTATION])] == ["p1-gpu-0"]
