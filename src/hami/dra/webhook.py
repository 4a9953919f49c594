"""``/webhook`` in DRA mode (``hami scheduler --dra-mode``): the shell around
:func:`hami.dra.translate.translate`.

For a Pod CREATE that asks for NVIDIA GPUs and names no claims: refuse what the normal
webhook refuses for isolation (host PID, privileged, ...), translate, make sure each
ResourceClaimTemplate exists in the pod's namespace (create; "already exists" is fine:
the name is a hash of the spec), and answer with the JSON Patch. A namespace with a GPU
memory or cores ResourceQuota is checked against the claims already there for hami's
DeviceClass or driver, ours or the tenant's own (ResourceQuota itself counts only
devices): an allocated claim books what it consumes, one not allocated yet what it
asks, a whole card booking the largest published card's memory. Percentages are accepted when every published card has one
size. Every other request
(pods without GPUs, other operations) goes to the normal webhook; pods that already use
claims are admitted untranslated. Whichever it is, a GPU pod passes the isolation
rules and loses any hand-written allocation annotations, as with the normal webhook.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import jsonpatch

from hami.api import names
from hami.core import isolation
from hami.core.config import SchedulerConfig
from hami.core.provenance import strip_allocation
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.quota import QuotaLedger
from hami.core.request import quantity
from hami.devices import nvidia
from hami.dra import translate as tr
from hami.dra.cache import DraObjects, card_sizes_mib, mig_offers
from hami.dra.slices import DRIVER

log = logging.getLogger(__name__)
JSON = dict[str, Any]
MIB = 2**20


def _reply(api_version: str, uid: str, allowed: bool, message: str = "",
           patch: list[JSON] | None = None, code: int = 403) -> JSON:
    resp: JSON = {"uid": uid, "allowed": allowed}
    if not allowed:
        resp["status"] = {"code": code, "message": message, "reason": "Forbidden",
                          "status": "Failure"}
    elif message:
        resp["status"] = {"code": 200, "message": message}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": resp}


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
                and e.get("deviceClassName") == tr.DEVICE_CLASS]
        ex = ours[-1] if ours else None
    if not isinstance(ex, Mapping) or ex.get("deviceClassName") != tr.DEVICE_CLASS:
        return 0, 0
    wanted = (ex.get("capacity") or {}).get("requests") or {}
    count = int(ex.get("count") or 1)
    memory = (to_int_exact(quantity(wanted["memory"])) or 0) // MIB \
        if "memory" in wanted else whole_card_mib
    return count * memory, count * (to_int_exact(quantity(wanted.get("cores", 0))) or 0)


def claim_booking(claim: Mapping[str, Any], whole_card_mib: int = 0) -> tuple[int, int]:
    """``(memory MiB, cores percent)`` a ResourceClaim books for the quota (only what
    it holds of hami's driver or asks of hami's DeviceClass).

    Allocated (``status.allocation`` holds results of our driver): what the allocation
    consumes (``consumedCapacity``: a whole-card claim books its card's memory); a result
    without ``consumedCapacity`` (a MIG instance, allocated whole) books what its request
    asked, once per request. Not allocated yet: what it asks (:func:`_asks`), a request
    without ``memory`` (the whole card) booking ``whole_card_mib`` (the largest card it
    could get). Malformed values count 0."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    results = [r for r in (alloc.get("devices") or {}).get("results") or []
               if isinstance(r, Mapping) and r.get("driver") == DRIVER]
    requests = [r for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests")
                or [] if isinstance(r, Mapping)]
    mem = cores = 0
    if results:
        asked: set[str] = set()
        for r in results:
            consumed = r.get("consumedCapacity")
            try:
                if not isinstance(consumed, Mapping):
                    main = str(r.get("request") or "").split("/", 1)[0]
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
        return mem, cores
    for req in requests:
        try:
            m, c = _asks(req, whole_card_mib)
        except (QuantityError, ValueError, TypeError, AttributeError):
            continue
        mem, cores = mem + m, cores + c
    return mem, cores


class DraWebhook:
    """Callable for the ``/webhook`` route. ``client``: lightkube ``AsyncClient``;
    ``fallback``: the normal webhook (body -> reply) for requests DRA mode leaves to it;
    ``quota``: the scheduler's namespace quota ledger (limits only are used)."""

    def __init__(self, client: Any, config: SchedulerConfig, fallback: Callable[[bytes], JSON],
                 quota: QuotaLedger | None = None, uniform_memory_mib: int | None = None) -> None:
        self.client = client
        self.config = config
        self.fallback = fallback
        self.quota = quota
        self.uniform_memory_mib = uniform_memory_mib

    async def _published(self) -> tuple[set[int], set[tuple[str, int]]]:
        """The distinct memory sizes (MiB) of the published shareable cards and the
        ``(profile, memory MiB)`` of the published MIG instance devices: from the watched
        slices (:class:`hami.dra.cache.DraObjects`), or one LIST before the watch has
        synced."""
        objs = DraObjects.shared(self.client)
        sizes, offers = objs.card_sizes_mib(), objs.mig_offers()
        if sizes is None or offers is None:
            from lightkube.resources.resource_v1 import ResourceSlice

            listed = [s.to_dict() async for s in self.client.list(ResourceSlice)]
            sizes, offers = card_sizes_mib(listed), mig_offers(listed)
        return sizes, offers

    async def _namespace_ledger(self, namespace: str, whole_card_mib: int) -> QuotaLedger | None:
        """A ledger with the namespace's limits and the bookings of all its current
        claims, hami's and those the tenant made itself, allocated or not
        (:func:`claim_booking`; whole cards of unallocated claims at ``whole_card_mib``)."""
        if self.quota is None or not self.quota.limited(namespace):
            return None
        from lightkube.resources.resource_v1 import ResourceClaim

        limits = self.quota.quota(namespace)
        ledger = QuotaLedger(self.config.registry[names.NVIDIA].resource_names())
        hard, gpu = {}, nvidia.settings(self.config)
        if limits.memory_limit_mib is not None:
            hard[f"limits.{gpu.resource_memory_name}"] = limits.memory_limit_mib
        if limits.cores_limit_percent is not None:
            hard[f"limits.{gpu.resource_core_name}"] = limits.cores_limit_percent
        ledger.set_quota(namespace, "gpu", hard)
        # Every claim: a tenant allowed to create claims makes them without our templates.
        async for claim in self.client.list(ResourceClaim, namespace=namespace):
            mem, cores = claim_booking(claim.to_dict(), whole_card_mib)
            ledger.charge(namespace, mem, cores)
        return ledger

    async def _ensure(self, namespace: str, template: JSON) -> None:
        from lightkube import ApiError, codecs

        doc = {**template, "metadata": {**template["metadata"], "namespace": namespace}}
        try:
            await self.client.create(codecs.from_dict(doc), namespace=namespace)
        except ApiError as exc:
            if exc.status.code != 409:
                raise

    async def __call__(self, body: bytes) -> JSON:
        """The AdmissionReview reply (never raises on bad input: 400/403 replies)."""
        try:
            doc = json.loads(body)
            request = doc["request"]
            pod = request["object"]
            api_version = str(doc.get("apiVersion") or "admission.k8s.io/v1")
            uid = str(request.get("uid") or "")
            creates_pod = ((request.get("kind") or {}).get("kind") in (None, "Pod")
                           and not request.get("subResource")
                           and request.get("operation") in (None, "", "CREATE"))
            if not isinstance(pod, dict):
                raise TypeError("request.object is not an object")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return self.fallback(body)
        if not creates_pod or not isolation.asks_for_devices(pod, self.config):
            return self.fallback(body)
        # As the normal webhook: no hand-written allocation survives creation (a
        # translated pod gets hami's schedulerName, whose scheduler charges them).
        clean, removed = strip_allocation(pod, self.config)
        note = (f"removed {', '.join(removed)} (only hami's scheduler writes them)"
                if removed else "")
        try:
            problems = isolation.violations(clean, self.config)
            if problems:
                return _reply(api_version, uid, False, isolation.message(problems))
            if tr.uses_claims(clean):
                return _reply(api_version, uid, True,
                              "; ".join(filter(None, ["pod uses ResourceClaims: left alone",
                                                      note])),
                              patch=jsonpatch.make_patch(pod, dict(clean)).patch)
            namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
            uniform, largest = self.uniform_memory_mib, self.uniform_memory_mib or 0
            sizes, offers = await self._published()
            if sizes:
                largest = max(sizes)
                if uniform is None and len(sizes) == 1:
                    uniform = largest
            ledger = await self._namespace_ledger(namespace, largest)
            result = tr.translate(
                clean, nvidia.settings(self.config), quota=ledger, uniform_memory_mib=uniform,
                whole_card_mib=largest, mig_offers=offers,
                scheduler_name=self.config.scheduler_name,
                overwrite_default_scheduler=self.config.force_overwrite_default_scheduler)
        except tr.TranslateError as exc:
            return _reply(api_version, uid, False, str(exc))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return _reply(api_version, uid, False, f"malformed pod: {exc}", code=400)
        if result is None:
            return self.fallback(body)
        for template in result.templates.values():
            await self._ensure(namespace, template)
        patch = jsonpatch.make_patch(pod, result.pod).patch
        return _reply(api_version, uid, True, note, patch=patch)


def route(webhook: DraWebhook) -> Callable[[bytes], Awaitable[JSON]]:
    """The handler the scheduler's ``/webhook`` route calls in DRA mode."""
    return webhook.__call__
