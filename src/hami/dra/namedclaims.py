"""DRA mode's ``/webhook`` for a pod that names ResourceClaims or ResourceClaimTemplates
itself, in a namespace with a GPU quota: what those claims ask of hami's DeviceClass is
checked against the quota.

* each template the pod names is one new claim (two entries naming one template: two
  claims), counted by :func:`hami.dra.booking.admission_asks`;
* a claim it names is already in the namespace's total, so it adds only what the total
  does not hold of it yet (:func:`hami.dra.booking.named_claim_extra`), except a claim
  booked under the pod it was made for (:mod:`hami.dra.podclaims`), which adds what it
  books: once a second pod reserves it, it no longer books as its pod's;
* a named object that cannot be found, read or counted is refused (fail closed); a hami
  template not made yet counts what the pod carries signed for it.

Bounded work (:mod:`hami.dra.bounds`): a pod with more than
:data:`hami.dra.bounds.MAX_POD_CLAIMS` entries is refused before any API request, and
each distinct template is read once per review, however many entries name it (the
namespace's claims come from one LIST).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hami.dra import booking, bounds, signedspecs

if TYPE_CHECKING:
    from hami.dra.webhook import DraWebhook

JSON = dict[str, Any]


async def denial(hook: DraWebhook, pod: Mapping[str, Any], namespace: str) -> str | None:
    """The denial for ``pod`` (it names claims or templates), None to go on.

    None always for a namespace without a GPU quota (no API request). Otherwise: the
    refusal when the pod has more than :data:`hami.dra.bounds.MAX_POD_CLAIMS` entries,
    when an entry is malformed, when a named object cannot be found, read or counted, or
    when what the entries add to the namespace's total does not fit its quota.
    Never raises for bad input; API errors other than reads of named objects (the LISTs)
    propagate (the caller refuses).
    """
    from lightkube import ApiError

    if hook.quota is None or not hook.quota.limited(namespace):
        return None
    too_many = bounds.claims_denial(pod)
    if too_many:
        return too_many
    prefix = f"cannot check the pod's claims against the GPU quota of namespace {namespace}"
    try:
        refs = booking.pod_claim_refs(pod)
    except booking.BookingError as exc:
        return f"{prefix}: {exc}"
    if not refs:
        return None
    sizes, _ = await hook.published()
    largest = max(sizes) if sizes else hook.uniform_memory_mib or 0
    claims: dict[str, JSON] = {}
    ledger = await hook.namespace_ledger(namespace, largest, claims)
    if ledger is None:
        return None
    mem = cores = 0
    ours: list[str] = []
    counted: set[str] = set()
    #: template name -> what one claim made from it asks (None: nothing of hami's)
    asked: dict[str, tuple[int, int] | None] = {}
    signed, why = hook._signed(pod, namespace)
    for ref in refs:
        try:
            if ref.template:
                what = f"ResourceClaimTemplate {namespace}/{ref.template}"
                if ref.template not in asked:
                    template = await hook._template(namespace, ref.template)
                    if template is None:
                        template = signed.get(ref.template)
                    if template is None:
                        return (f"{prefix}: {what} (spec.resourceClaims {ref.entry}) does not "
                                "exist; create it before the pod" + (
                                    f" (hami creates it only for a pod it translated: {why})"
                                    if ref.template.startswith(signedspecs.NAME_PREFIX)
                                    and why else ""))
                    asked[ref.template] = booking.admission_asks(
                        (template.get("spec") or {}).get("spec") or {}, largest, what)
                asks = asked[ref.template]
            else:
                what = f"ResourceClaim {namespace}/{ref.claim}"
                if ref.claim in counted:
                    continue
                counted.add(str(ref.claim))
                claim = claims.get(str(ref.claim))
                if claim is None:
                    return (f"{prefix}: {what} (spec.resourceClaims {ref.entry}) does not "
                            "exist; create it before the pod")
                asks = booking.named_claim_extra(claim, largest, what)
                if str(ref.claim) in ledger.grouped:
                    # booked under the pod it was made for (hami.dra.podclaims); a second
                    # pod using it uses it beside that pod's other claims: in full
                    asks = next(((h.memory_mib, h.cores_percent) for h in ledger.held
                                 if h.name == ref.claim), asks)
        except booking.BookingError as exc:
            return f"{prefix}: {exc}"
        except ApiError as exc:
            return f"{prefix}: cannot read {what}: {exc.status.code} {exc.status.message}"
        if asks is not None:
            if what not in ours:
                ours.append(what)
            mem, cores = mem + asks[0], cores + asks[1]
    if not ours or ledger.fits(namespace, mem, cores):
        return None
    return (f"exceeding resource quota: namespace {namespace}: the pod's claims "
            f"({', '.join(ours)}) add {mem} MiB and {cores}% cores of GPU; "
            f"{ledger.describe(namespace)}")
