"""DRA mode's ``/webhook`` for ResourceClaims and ResourceClaimTemplates: each one created
in a namespace with a GPU memory or cores quota is checked against it, so that what
reaches kube-scheduler never asks more than the namespace may have.

* A ResourceClaim CREATE asking hami's DeviceClass is refused when the namespace's total
  (every claim already there, :func:`hami.dra.booking.claim_booking`) plus what it asks
  (:func:`hami.dra.booking.admission_asks`: a spec of hami's shape as hami books its
  pods, any other strictly, ``allocationMode: All`` and malformed values refused) does
  not fit. This covers the claims the resourceclaim controller makes from templates for
  pods: the total counts claims, never pods, so the pod's claim is not counted twice; it
  is refused only when claims created since the pod's admission took the room (pods
  admitted in the same instant), and the controller retries until there is room again.
* A ResourceClaimTemplate CREATE is checked as one claim (each pod naming it makes one),
  so a template deleted and created again asking more is refused at once.
* Claims created in the same instant, on any scheduler replica, are checked one after
  another: each admitted claim is reserved on a Lease per namespace written with
  optimistic concurrency (:mod:`hami.dra.reservations`), and counts until the claim
  list shows it.
* UPDATE needs no check: the API server refuses any change to the ``spec`` of either kind
  (it is immutable). Other operations, kinds and subresources are allowed, and so is
  everything in a namespace without a GPU quota (no API request).

Never raises on bad input: a claim that cannot be counted is refused with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hami.core.podobjects import mapping_or_empty
from hami.dra import booking, podclaims, reservations

if TYPE_CHECKING:
    from hami.dra.webhook import DraWebhook

#: The API group and kinds this check handles.
GROUP = "resource.k8s.io"
CLAIM, TEMPLATE = "ResourceClaim", "ResourceClaimTemplate"


def handles(request: Mapping[str, Any]) -> bool:
    """True for an AdmissionReview ``request`` about a ResourceClaim or
    ResourceClaimTemplate of ``resource.k8s.io`` (any version, any operation)."""
    kind = request.get("kind")
    return isinstance(kind, Mapping) and kind.get("group") == GROUP \
        and kind.get("kind") in (CLAIM, TEMPLATE)


async def denial(hook: DraWebhook, request: Mapping[str, Any]) -> str | None:
    """The reason to refuse ``request`` (:func:`handles` is true for it), None to allow.

    Raises:
        lightkube ``ApiError`` or ``httpx`` errors when the namespace's claims or the
        published slices cannot be listed (the caller refuses: fail closed).
    """
    if request.get("operation") != "CREATE" or request.get("subResource"):
        return None
    obj = mapping_or_empty(request.get("object"))
    meta = mapping_or_empty(obj.get("metadata"))
    namespace = str(request.get("namespace") or meta.get("namespace") or "default")
    if hook.quota is None or not hook.quota.limited(namespace):
        return None
    kind = str(mapping_or_empty(request.get("kind")).get("kind"))
    name = str(meta.get("name") or request.get("name") or "") or \
        f"{meta.get('generateName') or ''}<generated>"
    what = f"{kind} {namespace}/{name}"
    spec = mapping_or_empty(obj.get("spec"))
    if kind == TEMPLATE:
        spec = mapping_or_empty(spec.get("spec"))
    sizes, _ = await hook.published()
    largest = max(sizes) if sizes else hook.uniform_memory_mib or 0
    try:
        asks = booking.admission_asks(spec, largest, what)
    except booking.BookingError as exc:
        return f"cannot check {what} against the GPU quota of namespace {namespace}: {exc}"
    if asks is None:
        return None
    each = " (each pod naming the template makes one claim)" if kind == TEMPLATE else ""

    now = hook.reservations.clock() if hook.reservations is not None else time.time()
    record = (podclaims.trusted_record(request, hook.trusted_creators, now)
              if kind == CLAIM else None)
    uid = str(meta.get("uid") or "")

    async def check(reserved: list[reservations.Reservation],
                    records: list[podclaims.PodClaimRecord] | None
                    ) -> tuple[str | None, set[str]]:
        # records None: the namespace ledger reads them from the Lease
        ledger = await hook.namespace_ledger(namespace, largest, {}, reserved=reserved,
                                             records=records)
        if ledger is None:
            return None, set()
        # what the namespace books with this claim, less what it books now: the claim's
        # asks, or, for a claim the resourceclaim controller made for a pod, what it adds
        # to its pod's booking (hami.dra.podclaims)
        before = ledger.charge_of()
        # (grouped only when ``records`` holds the claim's record: the reservations keep it)
        after = ledger.charge_of(podclaims.Held(f"<new {kind}>", uid, *asks))
        adds = (max(0, after.memory_mib - before.memory_mib),
                max(0, after.cores_percent - before.cores_percent))
        if ledger.fits(namespace, *adds):
            return None, ledger.listed_keys
        pod = after.grouped.get(f"<new {kind}>")
        grouped = (f" (booked with pod {namespace}/{pod}'s other claims as extender mode "
                   f"books the pod, it adds {adds[0]} MiB and {adds[1]}% cores)"
                   if pod is not None else "")
        held = (f" (with {ledger.pending} claim(s) admitted in the last "
                f"{hook.reservations.ttl_s if hook.reservations else 0:g} s and not stored "
                "yet)" if ledger.pending else "")
        return (f"exceeding resource quota: namespace {namespace}: {what} asks for "
                f"{asks[0]} MiB and {asks[1]}% cores of GPU{each}{grouped}; "
                f"{ledger.describe(namespace)}{held}"), ledger.listed_keys

    if kind == CLAIM and hook.reservations is not None:
        return await hook.reservations.reserve(
            namespace, reservations.new_claim_key(obj, str(request.get("uid") or "")), asks,
            check, record)
    return (await check([], None))[0]
