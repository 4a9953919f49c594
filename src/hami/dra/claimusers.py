"""Which containers of a pod get hami's GPUs through the claims it names (DRA mode).

A pod may get a ``gpu.hami.io`` device without naming any ``nvidia.com`` resource: by
naming one of hami's ``hami-gpu-`` templates, or a ResourceClaim or ResourceClaimTemplate
the tenant made itself asking hami's DeviceClass (allowed, and counted against the
namespace's GPU quota, :mod:`hami.dra.booking`). The containers using such a claim run on
hami's GPU like any GPU container, and the monitor reads the claim's task priority from
the ``CUDA_TASK_PRIORITY`` env of the first of them (:func:`hami.monitor.claims.attribute`),
so the webhook applies the rules of GPU containers to them
(:func:`hami.core.isolation.security_violations`): the priority-0 grant among them.
A claim of another driver leaves its containers alone; a named object that is missing or
cannot be read may yet ask hami's class, so it counts as hami's (fail closed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hami.dra import booking, signedspecs
from hami.dra.slices import DRIVER

#: ``(kind, namespace, name) -> the object as a dict``, None when it does not exist
#: (kind ``"ResourceClaim"`` or ``"ResourceClaimTemplate"``); raises on other API errors.
Reader = Callable[[str, str, str], Awaitable[Mapping[str, Any] | None]]


def asks_hami_class(claim_spec: Mapping[str, Any]) -> bool:
    """True when a claim spec (``ResourceClaim.spec``, a template's ``spec.spec``) has a
    request, or an entry of a prioritized list (``firstAvailable``), naming hami's
    DeviceClass (:data:`hami.dra.booking.DEVICE_CLASS`). Never raises."""
    devices = claim_spec.get("devices") if isinstance(claim_spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    for req in requests if isinstance(requests, list) else []:
        if not isinstance(req, Mapping):
            continue
        first = req.get("firstAvailable")
        entries = [req.get("exactly"), *(first if isinstance(first, list) else [])]
        if any(isinstance(e, Mapping) and e.get("deviceClassName") == booking.DEVICE_CLASS
               for e in entries):
            return True
    return False


def _containers_using(pod: Mapping[str, Any], entries: set[str] | None) -> set[str]:
    """Names of the containers (init or not) whose ``resources.claims`` name an entry of
    ``entries`` (names of ``spec.resourceClaims`` entries; None: any)."""
    spec = pod.get("spec")
    out: set[str] = set()
    for key in ("initContainers", "containers"):
        items = spec.get(key) if isinstance(spec, Mapping) else None
        for c in items if isinstance(items, list) else []:
            resources = c.get("resources") if isinstance(c, Mapping) else None
            claims = resources.get("claims") if isinstance(resources, Mapping) else None
            if isinstance(claims, list) and any(
                    isinstance(r, Mapping) and (entries is None or r.get("name") in entries)
                    for r in claims):
                out.add(str(c.get("name", "?")))
    return out


def hami_template_containers(pod: Mapping[str, Any]) -> set[str]:
    """The names of the containers (init or not) of ``pod`` using an entry of its
    ``spec.resourceClaims`` that names one of hami's own templates (``hami-gpu-``
    prefix): what the template reconciler knows without a read. Pure; never raises."""
    spec = pod.get("spec")
    items = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    entries = {str(e.get("name")) for e in items if isinstance(e, Mapping)
               and str(e.get("resourceClaimTemplateName") or "").startswith(
                   signedspecs.NAME_PREFIX)} if isinstance(items, list) else set()
    return _containers_using(pod, entries) if entries else set()


def holds_hami_device(claim: Mapping[str, Any]) -> bool:
    """True when the claim's ``status.allocation`` holds a device of hami's driver."""
    status = claim.get("status")
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return any(isinstance(r, Mapping) and r.get("driver") == DRIVER
               for r in results) if isinstance(results, list) else False


async def hami_claim_containers(pod: Mapping[str, Any], namespace: str,
                                read: Reader) -> set[str] | None:
    """The names of the containers of ``pod`` (in ``namespace``) that use a claim which
    may hold hami's GPU: an entry naming one of hami's templates, or a ResourceClaim or
    ResourceClaimTemplate that asks hami's DeviceClass (:func:`asks_hami_class`) or
    already holds a device of hami's driver, or one that is missing or cannot be read
    (``read`` raised). A ``spec.resourceClaims`` that is not of the API's shape makes
    every container using a claim count. None when no entry of the pod may hold hami's
    GPU (set() when one does but no container uses it). Never raises on ``read``'s
    errors."""
    try:
        refs = booking.pod_claim_refs(pod)
    except booking.BookingError:
        return _containers_using(pod, None)
    entries: set[str] = set()
    seen: dict[tuple[str, str], Mapping[str, Any] | None] = {}  # one read per object
    for ref in refs:
        kind = "ResourceClaimTemplate" if ref.template else "ResourceClaim"
        name = str(ref.template or ref.claim)
        if ref.template and name.startswith(signedspecs.NAME_PREFIX):  # hami's own
            entries.add(ref.entry)
            continue
        if (kind, name) not in seen:
            try:
                seen[kind, name] = await read(kind, namespace, name)
            except Exception:  # noqa: BLE001 - unreadable: may be hami's (fail closed)
                seen[kind, name] = None
        obj = seen[kind, name]
        if obj is None:
            entries.add(ref.entry)
            continue
        spec = obj.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        if ref.template:
            inner = spec.get("spec")
            spec = inner if isinstance(inner, Mapping) else {}
        if asks_hami_class(spec) or (not ref.template and holds_hami_device(obj)):
            entries.add(ref.entry)
    return _containers_using(pod, entries) if entries else None

