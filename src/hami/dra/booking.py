"""What DRA claims book against a namespace's GPU quota. Pure.

Two rules, both in MiB of memory and percent of a card's cores:

* :func:`claim_booking`: the namespace's total (every claim already there, hami's or the
  tenant's, allocated or not). Allocated: what the allocation consumes, a device
  allocated whole (a MIG instance) what the published slices say it holds; not allocated
  yet: what :func:`admission_asks` counts, or, for a claim it cannot count (made before
  the namespace had a quota), what it asks with a prioritized list (``firstAvailable``)
  counting its last entry of hami's DeviceClass and malformed values 0.
* :func:`admission_asks`: a new claim (created, or coming from a template a pod names or
  that is being created). A spec of the exact shape hami's translation writes
  (:func:`hami.dra.specshape.hami_shaped`) counts as hami booked the pod: ``count`` x
  ``memory`` and ``cores`` of its (last) shared-card entry, the MIG instances of its
  prioritized list counted at the request's memory. Any other spec is read by :func:`strict_asks`:
  tenant-written, so nothing is taken on trust: a prioritized list counts its largest
  entry, an entry without a ``memory`` request a whole card, ``allocationMode: All`` and
  malformed values are refused (:class:`BookingError`).

Whether a spec is of hami's shape, and whether a template found under hami's name asks
what hami would write, is :mod:`hami.dra.specshape`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.podobjects import mapping_or_empty
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra.slices import DRIVER, MIB
from hami.dra.specshape import hami_shaped

#: The DeviceClass hami's claims name (the same as :data:`hami.dra.translate.DEVICE_CLASS`).
DEVICE_CLASS = DRIVER
#: The least memory (MiB) one device of a claim consumes: the ``validRange`` minimum of
#: the ``memory`` capacity hami publishes (:mod:`hami.dra.slices`); smaller requests,
#: ``0`` included, are rounded up to it by kube-scheduler.
MIN_SHARE_MIB = 1


class BookingError(ValueError):
    """A claim, template or pod reference that cannot be counted; the message says why."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """One entry of a pod's ``spec.resourceClaims``: ``entry`` its name, and exactly one
    of ``claim`` (``resourceClaimName``) and ``template`` (``resourceClaimTemplateName``)."""

    entry: str
    claim: str | None = None
    template: str | None = None


def _asks(request: Any, whole_card_mib: int) -> tuple[int, int]:
    """``(memory MiB, cores percent)`` one claim request asks for: count x requested
    capacity (no ``memory``: ``whole_card_mib`` a card). A prioritized list
    (``firstAvailable``) asks what its last entry of hami's DeviceClass, the shared card,
    asks (the pod's own ``gpumem``/``gpucores``; a MIG instance is at least that). A
    request of another DeviceClass asks nothing of hami's GPUs. Raises on malformed
    values."""
    if not isinstance(request, Mapping):
        return 0, 0
    ex = request.get("exactly")
    first = request.get("firstAvailable")
    if not isinstance(ex, Mapping) and isinstance(first, list):
        ours = [e for e in first if isinstance(e, Mapping)
                and e.get("deviceClassName") == DEVICE_CLASS]
        ex = ours[-1] if ours else None
    if not isinstance(ex, Mapping) or ex.get("deviceClassName") != DEVICE_CLASS:
        return 0, 0
    wanted = (ex.get("capacity") or {}).get("requests") or {}
    count = int(ex.get("count") or 1)
    memory = (to_int_exact(quantity(wanted["memory"])) or 0) // MIB \
        if "memory" in wanted else whole_card_mib
    return count * memory, count * (to_int_exact(quantity(wanted.get("cores", 0))) or 0)


#: What a published device of our driver books when an allocation holds it whole (no
#: ``consumedCapacity``): ``(pool, device name) -> (memory MiB, cores percent or None)``
#: (:func:`hami.dra.cache.published_devices`; None: the device publishes no cores share).
PublishedDevices = Mapping[tuple[str, str], tuple[int, int | None]]

#: The cores share a device missing from the published slices books (a whole card).
WHOLE_CARD_CORES_PERCENT = 100


@dataclass(frozen=True, slots=True)
class Booking:
    """What one claim books: ``memory_mib``, ``cores_percent``, and ``unknown``: the
    allocated devices (``pool/device``) no published slice holds, booked as the largest
    published card (fail closed)."""

    memory_mib: int
    cores_percent: int
    unknown: tuple[str, ...] = ()


def claim_booking(claim: Mapping[str, Any], whole_card_mib: int = 0,
                  devices: PublishedDevices | None = None) -> tuple[int, int]:
    """``(memory MiB, cores percent)`` a ResourceClaim books for the quota: the first two
    fields of :func:`claim_booking_of`."""
    b = claim_booking_of(claim, whole_card_mib, devices)
    return b.memory_mib, b.cores_percent


def claim_booking_of(claim: Mapping[str, Any], whole_card_mib: int = 0,
                     devices: PublishedDevices | None = None) -> Booking:
    """The :class:`Booking` of a ResourceClaim for the quota (only what it holds of
    hami's driver or asks of hami's DeviceClass).

    Allocated (``status.allocation`` holds results of our driver): what the allocation
    consumes (``consumedCapacity``: a whole-card claim books its card's memory). A result
    without ``consumedCapacity`` (a MIG instance, allocated whole) books the device it
    names as ``devices`` (the published slices) has it: its ``memory`` capacity and its
    cores share (an instance without one: the cores its request asked, once per
    request); a device the
    slices do not hold books ``whole_card_mib`` (the largest published card) and
    :data:`WHOLE_CARD_CORES_PERCENT` and is named in ``unknown``, so that a tenant's
    request asking a tiny memory of a large instance never books less than the
    instance. ``devices`` None: such results book what their request asked, once per
    request (for callers without the slices). Not allocated yet: :func:`admission_asks`
    (what the claim was checked with when it was created), a request without ``memory``
    (the whole card) booking ``whole_card_mib`` (the largest card it could get); a claim
    that rule refuses counts what it asks (:func:`_asks`: a prioritized list its last
    entry), malformed values 0."""
    results = _results(claim)
    requests = [r for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests")
                or [] if isinstance(r, Mapping)]
    mem = cores = 0
    if results:
        asked: set[str] = set()
        unknown: list[str] = []
        for r in results:
            consumed = r.get("consumedCapacity")
            try:
                if not isinstance(consumed, Mapping):
                    main = str(r.get("request") or "").split("/", 1)[0]
                    if devices is not None:
                        ref = (str(r.get("pool") or ""), str(r.get("device") or ""))
                        found = devices.get(ref)
                        if found is None:
                            unknown.append("/".join(ref))
                            mem += whole_card_mib
                            cores += WHOLE_CARD_CORES_PERCENT
                            continue
                        mem += found[0]
                        if found[1] is not None:
                            cores += found[1]
                        elif main not in asked:
                            asked.add(main)
                            cores += sum(_asks(req, whole_card_mib)[1] for req in requests
                                         if req.get("name") == main)
                        continue
                    if main not in asked:
                        asked.add(main)
                        for req in requests:
                            if req.get("name") == main:
                                m, c = _asks(req, whole_card_mib)
                                mem, cores = mem + m, cores + c
                    continue
                mem += (to_int_exact(quantity(consumed.get("memory", 0))) or 0) // MIB
                cores += to_int_exact(quantity(consumed.get("cores", 0))) or 0
            except (QuantityError, ValueError, TypeError, AttributeError):
                continue
        return Booking(mem, cores, tuple(unknown))
    try:
        asks = admission_asks(mapping_or_empty(claim.get("spec")), whole_card_mib, "claim")
        return Booking(*(asks or (0, 0)))
    except BookingError:
        pass
    for req in requests:
        try:
            m, c = _asks(req, whole_card_mib)
        except (QuantityError, ValueError, TypeError, AttributeError):
            continue
        mem, cores = mem + m, cores + c
    return Booking(mem, cores)


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The allocation results of our driver in ``status.allocation``."""
    alloc = mapping_or_empty(mapping_or_empty(claim.get("status")).get("allocation"))
    results = mapping_or_empty(alloc.get("devices")).get("results")
    return [r for r in results if isinstance(r, Mapping) and r.get("driver") == DRIVER] \
        if isinstance(results, list) else []


def _whole(value: Any, what: str) -> int:
    try:
        exact = to_int_exact(quantity(value))
    except (QuantityError, ValueError, TypeError) as exc:
        raise BookingError(f"{what}: {exc}") from None
    if exact is None or exact < 0:
        raise BookingError(f"{what}: {value!r} is not a whole non-negative amount")
    return exact


def _entry_asks(entry: Mapping[str, Any], whole_card_mib: int, what: str) -> tuple[int, int]:
    """``(memory MiB, cores percent)`` one ``exactly`` entry of our class asks, strictly."""
    if entry.get("allocationMode", "ExactCount") != "ExactCount":
        raise BookingError(f"{what}: allocationMode {entry.get('allocationMode')!r} asks for "
                           "an unknown number of cards and cannot be counted against a GPU "
                           "quota; ask for a count")
    count = _whole(entry.get("count", 1), f"{what} count")
    wanted = mapping_or_empty(mapping_or_empty(entry.get("capacity")).get("requests"))
    # a request under the card's minimum (1 MiB, the slices' validRange) consumes that
    # minimum: the scheduler rounds it up
    memory_mib = max(MIN_SHARE_MIB, -(-_whole(wanted["memory"], f"{what} memory") // MIB)) \
        if "memory" in wanted else whole_card_mib
    cores = _whole(wanted.get("cores", 0), f"{what} cores")
    return max(count, 1) * memory_mib, max(count, 1) * cores


def strict_asks(claim_spec: Mapping[str, Any], whole_card_mib: int, what: str
                ) -> tuple[int, int] | None:
    """``(memory MiB, cores percent)`` a claim spec (``ResourceClaim.spec``, or a
    template's ``spec.spec``) asks of hami's DeviceClass, read as a tenant may have
    written it; None when no request names the class. Each request counts its ``count``
    times its ``memory`` (rounded up to MiB, at least :data:`MIN_SHARE_MIB`; none:
    ``whole_card_mib``, the largest
    published card) and ``cores``; a prioritized list counts the largest of its entries of
    the class, memory and cores each (kube-scheduler may pick any). ``what`` names the
    object in messages.

    Raises:
        BookingError: ``allocationMode`` other than ``ExactCount``, or a count, memory or
            cores that is not a whole non-negative quantity, on a request of the class.
    """
    requests = mapping_or_empty(mapping_or_empty(claim_spec).get("devices")).get("requests")
    found = False
    mem = cores = 0
    for pos, req in enumerate(requests if isinstance(requests, list) else []):
        req = mapping_or_empty(req)
        name = f"{what} request {req.get('name') or pos}"
        first = req.get("firstAvailable")
        entries = [req.get("exactly")] if req.get("exactly") is not None else \
            (first if isinstance(first, list) else [])
        asks = [_entry_asks(mapping_or_empty(e), whole_card_mib, name) for e in entries
                if mapping_or_empty(e).get("deviceClassName") == DEVICE_CLASS]
        if asks:
            found = True
            mem += max(m for m, _ in asks)
            cores += max(c for _, c in asks)
    return (mem, cores) if found else None


def admission_asks(claim_spec: Mapping[str, Any], whole_card_mib: int, what: str
                   ) -> tuple[int, int] | None:
    """``(memory MiB, cores percent)`` a new claim with this spec asks of hami's
    DeviceClass; None when no request names the class. A spec of hami's shape
    (:func:`hami.dra.specshape.hami_shaped`) counts as hami books a translated pod:
    ``count`` x ``memory`` (none: ``whole_card_mib``) and ``cores`` of its shared-card
    entry; any other is read strictly (:func:`strict_asks`). ``what`` names the object in
    messages.

    Raises:
        BookingError: as :func:`strict_asks`, for a spec not of hami's shape.
    """
    if hami_shaped(claim_spec):
        (request,) = mapping_or_empty(claim_spec.get("devices")).get("requests") or [{}]
        return _asks(request, whole_card_mib)
    return strict_asks(claim_spec, whole_card_mib, what)


def named_claim_extra(claim: Mapping[str, Any], whole_card_mib: int, what: str
                      ) -> tuple[int, int] | None:
    """What an existing ResourceClaim named by a new pod adds to the namespace's total
    (which already holds its :func:`claim_booking`): nothing once allocated (the
    allocation is exact), else :func:`strict_asks` minus :func:`claim_booking`, never
    below 0. None when it neither holds nor asks for hami's devices.

    Raises:
        BookingError: as :func:`strict_asks`, for a claim not allocated yet.
    """
    if _results(claim):
        return 0, 0
    strict = strict_asks(mapping_or_empty(claim.get("spec")), whole_card_mib, what)
    if strict is None:
        return None
    counted = claim_booking(claim, whole_card_mib)
    return max(0, strict[0] - counted[0]), max(0, strict[1] - counted[1])


def pod_claim_refs(pod: Mapping[str, Any]) -> list[ClaimRef]:
    """The entries of the pod's ``spec.resourceClaims`` ([] when it names none).

    Raises:
        BookingError: the field or an entry is not of the API's shape (not a list, not an
            object, no name, neither or both of ``resourceClaimName`` and
            ``resourceClaimTemplateName``, a name that is not a string).
    """
    raw = mapping_or_empty(pod.get("spec")).get("resourceClaims")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BookingError("spec.resourceClaims is not a list")
    out = []
    for pos, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise BookingError(f"spec.resourceClaims[{pos}] is not an object")
        names = {k: entry.get(k) for k in ("name", "resourceClaimName",
                                          "resourceClaimTemplateName")}
        if any(v is not None and not isinstance(v, str) for v in names.values()):
            raise BookingError(f"spec.resourceClaims[{pos}]: names must be strings")
        claim, template = names["resourceClaimName"], names["resourceClaimTemplateName"]
        if not names["name"] or bool(claim) == bool(template):
            raise BookingError(f"spec.resourceClaims[{pos}] must have a name and exactly one "
                               "of resourceClaimName and resourceClaimTemplateName")
        out.append(ClaimRef(str(names["name"]), claim or None, template or None))
    return out
