"""A pod's claims booked as the pod (:mod:`hami.dra.podclaims`) and the core's collapse
for shared objects (:func:`hami.core.collapse.phase_request`): the pure part. The real
control plane path is tests/e2e/test_dra_init_quota_e2e.py."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hami.core.collapse import APP, INIT, SIDECAR, effective_request, phase_request
from hami.dra import podclaims as pc

CONTROLLER = "system:kube-controller-manager"


def _review(user: str = CONTROLLER, **meta: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "uid": "claim-1", "generateName": "p-gpu-0-",
        "annotations": {pc.POD_CLAIM_NAME: "gpu-0"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-1",
                             "controller": True, "blockOwnerDeletion": True}]}
    metadata.update(meta)
    return {"operation": "CREATE", "userInfo": {"username": user},
            "object": {"metadata": metadata}}


def _pod(uid: str = "pod-1", init: dict[str, list[str]] | None = None,
         app: dict[str, list[str]] | None = None, sidecars: tuple[str, ...] = (),
         entries: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod: ``init``/``app`` container name -> the entries it uses; ``entries``: entry
    -> "template" or "claim" (default: a template entry for each entry used)."""
    init, app = init or {}, app or {}
    used = {e for names in [*init.values(), *app.values()] for e in names}
    entries = entries if entries is not None else {e: "template" for e in sorted(used)}

    def ctr(name: str, uses: list[str]) -> dict[str, Any]:
        c: dict[str, Any] = {"name": name, "resources": {"claims": [{"name": e}
                                                                   for e in uses]}}
        if name in sidecars:
            c["restartPolicy"] = "Always"
        return c

    return {"metadata": {"name": f"pod-{uid}", "uid": uid},
            "spec": {"initContainers": [ctr(n, u) for n, u in init.items()],
                     "containers": [ctr(n, u) for n, u in app.items()],
                     "resourceClaims": [
                         {"name": e, "resourceClaimTemplateName" if kind == "template"
                          else "resourceClaimName": f"x-{e}"} for e, kind in entries.items()]}}


def _rec(claim: str, entry: str, pod: str = "pod-1") -> pc.PodClaimRecord:
    return pc.PodClaimRecord(claim, pod, entry, 0.0)


def _held(name: str, mib: int, uid: str | None = None,
          users: tuple[str, ...] = ()) -> pc.Held:
    return pc.Held(name, uid if uid is not None else f"u-{name}", mib, 0, frozenset(users))


INIT_APP = _pod(init={"prepare": ["gpu-0"]}, app={"main": ["gpu-1"]})


def test_only_the_controllers_claim_creates_with_a_uid_are_recorded() -> None:
    assert pc.trusted_record(_review(), pc.TRUSTED_CREATORS, 5.0) == \
        pc.PodClaimRecord("claim-1", "pod-1", "gpu-0", 5.0)
    sa = "system:serviceaccount:kube-system:resource-claim-controller"
    assert pc.trusted_record(_review(sa), pc.TRUSTED_CREATORS, 5.0) is not None
    # a tenant (any other user), a mutating review (no UID yet), owners not of the shape
    # the controller writes, no entry annotation: not recorded
    for review in (
            _review("alice"), _review("system:serviceaccount:kube-system:default"),
            _review(uid=""), _review(annotations={}),
            _review(ownerReferences=[]),
            _review(ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "uid": "pod-1"}]),
            _review(ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                      "uid": "rs", "controller": True}]),
            _review(ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "uid": "a",
                                      "controller": True},
                                     {"apiVersion": "v1", "kind": "Pod", "uid": "b",
                                      "controller": True}]),
            {"userInfo": "x", "object": []}, {}):
        assert pc.trusted_record(review, pc.TRUSTED_CREATORS, 5.0) is None, review
    # the trusted identities are configurable
    assert pc.trusted_record(_review("alice"), ["alice"], 5.0) is not None
    assert pc.trusted_record(_review(), [], 5.0) is None


def test_records_round_trip_and_malformed_values_hold_none() -> None:
    records = [_rec("c1", "gpu-0"), pc.PodClaimRecord("c2", "p2", "gpu-1", 12.5)]
    assert pc.parse(pc.dump(records)) == records
    assert pc.parse("not json") == pc.parse(None) == pc.parse('{"a": 1}') == []
    assert pc.parse('[["c", "p", "e", 1], ["c", "", "e", 1], ["c", "p", "e", true], 3]') == \
        [pc.PodClaimRecord("c", "p", "e", 1.0)]


def test_an_init_and_an_app_claim_book_as_extender_mode_books_the_pod() -> None:
    held = [_held("a", 10000, "c0"), _held("b", 10000, "c1")]
    records = [_rec("c0", "gpu-0"), _rec("c1", "gpu-1")]
    charge = pc.namespace_charge(held, [INIT_APP], records)
    assert (charge.memory_mib, charge.grouped) == (10000, {"a": "pod-pod-1", "b": "pod-pod-1"})
    # without records (claims nobody saw the controller make) each counts in full
    assert pc.namespace_charge(held, [INIT_APP], []).memory_mib == 20000
    # nor when the pod is gone (a pod of that UID is not in the namespace)
    assert pc.namespace_charge(held, [_pod("other")], records).memory_mib == 20000


def test_a_forged_claim_never_books_less_than_in_full() -> None:
    records = [_rec("c0", "gpu-0"), _rec("c1", "gpu-1")]
    real = [_held("a", 10000, "c0"), _held("b", 10000, "c1")]
    base = pc.namespace_charge(real, [INIT_APP], records).memory_mib
    # a claim whose UID has no record (the tenant's, whatever its owners say) adds itself
    forged = _held("f", 4000, "f-uid")
    assert pc.namespace_charge([*real, forged], [INIT_APP], records).memory_mib == base + 4000
    # a record for an entry the pod names by claim, or does not name: in full
    by_name = _pod(init={"prepare": ["gpu-0"]}, app={"main": ["gpu-1"]},
                   entries={"gpu-0": "claim", "gpu-1": "template"})
    assert pc.namespace_charge(real, [by_name], records).memory_mib == 20000
    assert pc.namespace_charge(real, [INIT_APP], [_rec("c0", "gpu-9"), records[1]]
                               ).memory_mib == 20000
    # a second recorded claim for one entry counts in full
    twice = [*real, _held("a2", 3000, "c2")]
    assert pc.namespace_charge(twice, [INIT_APP], [*records, _rec("c2", "gpu-0")]
                               ).memory_mib == base + 3000
    # a claim another pod reserves too is used beside the pod's other claims: in full
    shared = [_held("a", 10000, "c0", ("pod-1", "pod-q")), real[1]]
    assert pc.namespace_charge(shared, [INIT_APP], records).memory_mib == 20000
    own = [_held("a", 10000, "c0", ("pod-1",)), real[1]]
    assert pc.namespace_charge(own, [INIT_APP], records).memory_mib == 10000
    # a claim not stored yet (a reservation without a UID) counts in full
    assert pc.namespace_charge([*real, _held("r", 500, "")], [INIT_APP], records
                               ).memory_mib == base + 500


def test_sidecars_and_unused_claims_are_held_for_the_pods_life() -> None:
    pod = _pod(init={"side": ["s"], "prepare": ["i"]}, app={"main": ["m"]},
               sidecars=("side",), entries={"s": "template", "i": "template",
                                            "m": "template", "idle": "template"})
    held = [_held(n, mib, n) for n, mib in (("s", 1000), ("i", 8000), ("m", 3000),
                                            ("idle", 500))]
    records = [_rec(n, n) for n in ("s", "i", "m", "idle")]
    # max(init 8000 + sidecar 1000, sidecar 1000 + app 3000) + the unused claim 500
    assert pc.namespace_charge(held, [pod], records).memory_mib == 9500


@given(st.lists(st.tuples(st.sampled_from([INIT, SIDECAR, APP]),
                          st.integers(0, 20000), st.integers(0, 100)), max_size=8))
def test_phase_request_is_effective_request_without_shared_objects(
        parts: list[tuple[Any, int, int]]) -> None:
    containers = [(role, {f"c{i}"}) for i, (role, _, _) in enumerate(parts)]
    bookings = {f"c{i}": (m, c) for i, (_, m, c) in enumerate(parts)}
    assert phase_request(containers, bookings) == effective_request(parts)


def test_phase_request_books_a_shared_object_once_per_phase() -> None:
    bookings = {"x": (4000, 10), "y": (1000, 5)}
    # one claim used by an init and an app container: held once in each phase
    assert phase_request([(INIT, {"x"}), (APP, {"x"})], bookings) == (4000, 10)
    # two app containers sharing one claim, and an init container with two claims
    assert phase_request([(APP, {"x"}), (APP, {"x", "y"})], bookings) == (5000, 15)
    assert phase_request([(INIT, {"x", "y"}), (APP, set())], bookings) == (5000, 15)
    # a sidecar's claim used by a later init container again: once
    assert phase_request([(SIDECAR, {"y"}), (INIT, {"x", "y"})], bookings) == (5000, 15)
    # an object held in every phase
    assert phase_request([(INIT, {"x"})], bookings, always={"y"}) == (5000, 15)
