"""The counting rules of DRA mode's namespace GPU quota for claims a tenant wrote
(:mod:`hami.dra.booking`): strict reading of a new pod's claims and templates, what a
named claim adds to a total that already holds it, the pod's references, and the
comparison of a template found under hami's name with hami's
(:func:`hami.dra.specshape.same_template_spec`)."""

from __future__ import annotations

from typing import Any

import pytest

from hami.dra import translate as tr
from hami.dra.booking import (
    BookingError,
    ClaimRef,
    claim_booking,
    named_claim_extra,
    pod_claim_refs,
    strict_asks,
)
from hami.dra.slices import MIB
from hami.dra.specshape import same_template_spec


def _exactly(memory: str | None = None, cores: str | None = None, count: int = 1,
             cls: str = "gpu.hami.io", **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    return {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count,
            "capacity": {"requests": requests}, **extra}


def _spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def test_strict_asks_counts_count_memory_cores_and_whole_cards() -> None:
    spec = _spec({"name": "a", "exactly": _exactly("2000Mi", "30", count=2)},
                 {"name": "b", "exactly": _exactly(cores="10")},
                 {"name": "nic", "exactly": _exactly("9000Mi", cls="nic.example.com")})
    # 2 x 2000 + a whole card (the largest published, 16384) for "b"; the NIC asks nothing
    assert strict_asks(spec, 16384, "t") == (4000 + 16384, 60 + 10)
    assert strict_asks(_spec({"name": "nic", "exactly": _exactly(
        "9000Mi", cls="nic.example.com")}), 16384, "t") is None
    # memory rounds up to MiB: one byte over 1 MiB books 2 MiB
    assert strict_asks(_spec({"name": "a", "exactly": _exactly(str(MIB + 1))}), 0, "t") == (2, 0)


def test_a_prioritized_list_counts_its_largest_entry_not_its_last() -> None:
    """kube-scheduler takes the first entry it can satisfy: a list [30000 MiB, 1 MiB]
    can get 30000 MiB. The namespace total counts a pending claim that is not of hami's
    shape the same way (it once counted the last entry, 1 MiB, until allocation)."""
    spec = _spec({"name": "gpu", "firstAvailable": [
        {"name": "big", **_exactly("30000Mi", "5")},
        {"name": "small", **_exactly("1Mi", "50")}]})
    assert strict_asks(spec, 16384, "t") == (30000, 50)
    assert claim_booking({"spec": spec}, 16384) == (30000, 50)


@pytest.mark.parametrize(("entry", "words"), [
    (_exactly("1000Mi", allocationMode="All"), "allocationMode 'All'"),
    (_exactly("500m"), "memory"),
    (_exactly("1000Mi", "lots"), "cores"),
    (_exactly("1000Mi", "-5"), "cores"),
    ({**_exactly("1000Mi"), "count": "many"}, "count"),
])
def test_what_cannot_be_counted_is_refused(entry: dict[str, Any], words: str) -> None:
    with pytest.raises(BookingError, match=words):
        strict_asks(_spec({"name": "r", "exactly": entry}), 16384, "ResourceClaim ns/c")


def test_a_named_claim_adds_only_what_the_total_does_not_hold() -> None:
    allocated = {"spec": _spec({"name": "gpu", "exactly": _exactly("2000Mi")}),
                 "status": {"allocation": {"devices": {"results": [
                     {"request": "gpu", "driver": "gpu.hami.io", "pool": "n1",
                      "device": "gpu-0", "consumedCapacity": {"memory": "2000Mi"}}]}}}}
    assert named_claim_extra(allocated, 16384, "c") == (0, 0)
    plain = {"spec": _spec({"name": "gpu", "exactly": _exactly("2000Mi", "10")})}
    assert named_claim_extra(plain, 16384, "c") == (0, 0)
    listed = {"spec": _spec({"name": "gpu", "firstAvailable": [
        {"name": "big", **_exactly("30000Mi")}, {"name": "small", **_exactly("1Mi")}]})}
    # the total counts a pending prioritized list by its largest entry already
    assert claim_booking(listed, 16384) == (30000, 0)
    assert named_claim_extra(listed, 16384, "c") == (0, 0)
    other = {"spec": _spec({"name": "n", "exactly": _exactly(cls="nic.example.com")})}
    assert named_claim_extra(other, 16384, "c") is None


def test_pod_claim_refs() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "c1"},
                                       {"name": "b", "resourceClaimTemplateName": "t1"}]}}
    assert pod_claim_refs(pod) == [ClaimRef("a", claim="c1"), ClaimRef("b", template="t1")]
    assert pod_claim_refs({"spec": {}}) == [] and pod_claim_refs({}) == []


@pytest.mark.parametrize("claims", [
    "x", ["x"], [{"name": "a"}], [{"resourceClaimName": "c"}],
    [{"name": "a", "resourceClaimName": "c", "resourceClaimTemplateName": "t"}],
    [{"name": "a", "resourceClaimName": 7}],
])
def test_malformed_pod_claim_refs_are_refused(claims: Any) -> None:
    with pytest.raises(BookingError, match="resourceClaims"):
        pod_claim_refs({"spec": {"resourceClaims": claims}})


def test_same_template_spec_compares_quantities_by_value() -> None:
    """The API server writes 2048Mi back as 2Gi and leaves out empty fields: still hami's.
    Any other difference (more memory, claim metadata) is not."""
    _, ours = tr.template_for(tr.claim_spec(1, 2048, 10, []))
    stored = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.hami.io", "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {"cores": "10", "memory": "2Gi"}}}}],
        "constraints": [], "config": []}}}
    assert same_template_spec(ours["spec"], stored)
    bigger = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        **stored["spec"]["devices"]["requests"][0]["exactly"],
        "capacity": {"requests": {"cores": "10", "memory": "20Gi"}}}}]}}}
    assert not same_template_spec(ours["spec"], bigger)
    assert not same_template_spec(ours["spec"], {**stored, "metadata": {"labels": {"a": "b"}}})
    assert not same_template_spec(ours["spec"], {})


@pytest.mark.parametrize("memory", ["0", "0Mi", "0.0Gi"])
def test_a_zero_memory_request_books_the_smallest_share_the_card_gives(memory: str) -> None:
    """Red team: a tenant's claim asking ``memory: 0`` (count 3) was booked at 0 MiB, yet
    the card's request policy (validRange min 1 MiB, :mod:`hami.dra.slices`) rounds a
    smaller request up to its minimum, so each device consumes 1 MiB once allocated:
    claims created faster than they are allocated slipped past the quota. Each device
    now books at least that minimum, as it will consume."""
    spec = _spec({"name": "gpu", "exactly": _exactly(memory, "0", count=3)})
    assert strict_asks(spec, 16384, "t") == (3, 0)
    assert claim_booking({"spec": spec}, 16384) == (3, 0)
