"""DRA webhook, namespace GPU quota: a claim allocated on a MIG instance (allocated
whole, no ``consumedCapacity``) books the instance's published memory and cores share,
not what its request asked; an allocated device no published slice holds books the
largest published card, and a denial it tips says so. The API client is the recording
stub of ``test_webhook``; the slices are built by :mod:`hami.dra.migslices`."""

from __future__ import annotations

import asyncio
from typing import Any

from hami.core.quota import QuotaLedger
from hami.devices.registry import make_config
from hami.dra import translate as tr
from hami.dra.booking import claim_booking, claim_booking_of
from hami.dra.cache import published_devices
from tests.dra.test_claimquota import _exactly, _run, _tenant_claim
from tests.dra.test_webhook import _Client, _mig_slice, _slice

#: The A100 of ``_mig_slice``: 3g.20gb holds 19968 MiB and 42% of the cores, 1g.5gb
#: 4864 MiB and 14%.
BIG, BIG_CORES = "gpu-0-3g-20gb-0", 42
SMALL, SMALL_CORES = "gpu-0-1g-5gb-0", 14


def _on_instance(claim: dict[str, Any], device: str, request: str = "gpu",
                 pool: str = "m1") -> dict[str, Any]:
    """``claim`` allocated whole on ``device`` of ``pool`` (as the allocator writes a
    device without consumable capacity: no ``consumedCapacity``)."""
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": request, "driver": "gpu.hami.io", "pool": pool, "device": device}]}}}
    return claim


def _tiny_on(device: str, cores: str = "0", pool: str = "m1") -> dict[str, Any]:
    """A tenant's claim asking 1 MiB with a selector aimed at MIG instances, allocated
    on ``device``."""
    aimed = {"cel": {"expression": '"profile" in device.attributes["gpu.hami.io"]'}}
    return _on_instance(_tenant_claim("tiny", _exactly("1Mi", cores, selectors=[aimed])),
                        device, pool=pool)


def _quota(memory_mib: int | None = None, cores_percent: int | None = None) -> QuotaLedger:
    quota = QuotaLedger(make_config().registry["NVIDIA"].resource_names())
    hard = {}
    if memory_mib is not None:
        hard["limits.nvidia.com/gpumem"] = memory_mib
    if cores_percent is not None:
        hard["limits.nvidia.com/gpucores"] = cores_percent
    quota.set_quota("ns", "gpu", hard)
    return quota


def test_a_tiny_request_on_a_large_instance_books_the_instance() -> None:
    """20000 MiB quota; a tenant claim asking 1 MiB holds a 3g.20gb instance (19968
    MiB): a new claim of 1000 MiB no longer fits."""
    client = _Client([_mig_slice("m1")], [_tiny_on(BIG)])
    resp, _ = _run(client, _tenant_claim("next", _exactly("1000Mi")), _quota(20000))
    assert not resp["allowed"], resp
    assert "(19968 MiB in use)" in resp["status"]["message"]
    small, _ = _run(client, _tenant_claim("next", _exactly("32Mi")), _quota(20000))
    assert small["allowed"], small


def test_an_instance_books_its_profiles_cores_share() -> None:
    """A claim asking no cores on a 1g.5gb instance books the profile's 14%: 90% of a
    100% quota no longer fits."""
    client = _Client([_mig_slice("m1")], [_tiny_on(SMALL)])
    resp, _ = _run(client, _tenant_claim("next", _exactly("1Mi", "90")),
                   _quota(cores_percent=100))
    assert not resp["allowed"], resp
    assert f"({SMALL_CORES}% in use)" in resp["status"]["message"]


def test_hamis_claim_allocated_on_an_instance_books_the_instance() -> None:
    """hami's prioritized list for 4000 MiB and 10% allocated on its 1g.5gb entry books
    the instance (4864 MiB, 14%), as HAMi books a MIG instance; on the shared card it
    books what it consumes."""
    devices = published_devices([_mig_slice("m1")])
    spec = tr.claim_spec(1, 4000, 10, [], ["1g.5gb"])
    claim = _on_instance({"metadata": {"name": "c", "namespace": "ns"}, "spec": spec},
                         SMALL, request="gpu/mig-1g-5gb")
    assert claim_booking(claim, 40960, devices) == (4864, SMALL_CORES)


def test_an_instance_missing_from_the_slices_books_the_largest_card_and_says_so() -> None:
    """The claim's device is in no published slice (gone, or never ours): it books the
    largest published card and 100% cores, and the denial names the claim and why."""
    client = _Client([_slice("n1", 16384, 8192), _mig_slice("m1")],
                     [_tiny_on("gpu-0-7g-40gb-0")])
    resp, _ = _run(client, _tenant_claim("next", _exactly("4000Mi")), _quota(20000))
    assert not resp["allowed"], resp
    message = resp["status"]["message"]
    assert "(16384 MiB in use)" in message
    assert "ResourceClaim ns/tiny holds m1/gpu-0-7g-40gb-0, which no published " \
        "ResourceSlice holds: booked as the largest published card (16384 MiB, 100% " \
        "cores)" in message
    # the same device name in another pool is not the published one
    other = _tiny_on(BIG, pool="elsewhere")
    assert claim_booking_of(other, 16384, published_devices(client.slices)).unknown == \
        ("elsewhere/" + BIG,)


def test_the_note_appears_only_when_a_claim_was_booked_fail_closed() -> None:
    client = _Client([_mig_slice("m1")], [_tiny_on(BIG)])
    resp, _ = _run(client, _tenant_claim("next", _exactly("1000Mi")), _quota(20000))
    assert "no published ResourceSlice" not in resp["status"]["message"]


def test_published_devices_reads_instances_and_cards() -> None:
    """Instances: memory capacity and ``coresPercent``; cards: memory and cores
    capacities; an instance published without ``coresPercent`` (an older node plugin)
    books the cores its request asked."""
    card = _slice("n1", 16384)
    card["spec"]["devices"][0]["capacity"]["cores"] = {"value": "100"}
    mig = _mig_slice("m1")
    devices = published_devices([card, mig])
    assert devices[("m1", BIG)] == (19968, BIG_CORES)
    assert devices[("m1", SMALL)] == (4864, SMALL_CORES)
    assert devices[("n1", "gpu-0")] == (16384, 100)
    for d in mig["spec"]["devices"]:
        del d["attributes"]["coresPercent"]
    older = published_devices([mig])
    assert older[("m1", BIG)] == (19968, None)
    assert claim_booking(_tiny_on(BIG, cores="7"), 16384, older) == (19968, 7)


def test_without_the_slices_the_request_is_booked_as_before() -> None:
    """Callers that pass no published devices keep the request-based booking."""
    assert claim_booking(_tiny_on(BIG), 16384) == (1, 0)


def test_the_watched_copy_gives_the_same_devices() -> None:
    """:class:`hami.dra.cache.DraObjects` after its first list answers what the pure
    function does."""
    from hami.dra.cache import DraObjects

    async def go() -> Any:
        objs = DraObjects(_Client([_mig_slice("m1")]))
        assert objs.published_devices() is None
        objs.start()
        await asyncio.wait_for(objs.synced["slices"].wait(), 5)
        try:
            return objs.published_devices()
        finally:
            await objs.stop()

    assert asyncio.run(go()) == published_devices([_mig_slice("m1")])
