"""What DRA mode's quota checks read from the cluster: the published cards and devices
(the watched ResourceSlices, or one LIST before the watch has synced) and a namespace's
ledger (its GPU ResourceQuota limits and the bookings of all its claims, with the
reservations across replicas and the claims the resourceclaim controller made for a
pod). Reads only.

:class:`QuotaView` is the part of :class:`hami.dra.webhook.DraWebhook` that reads; the
webhook's pod check, :mod:`hami.dra.claimquota` and :mod:`hami.dra.namedclaims` decide
with what it returns (:class:`hami.dra.nsledger.NamespaceLedger`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hami.api import names
from hami.core.config import SchedulerConfig
from hami.core.quota import QuotaLedger
from hami.devices import nvidia
from hami.dra import booking, podclaims
from hami.dra.cache import DraObjects, card_sizes_mib, mig_offers, published_devices
from hami.dra.nsledger import NamespaceLedger
from hami.dra.podclaims import PodClaimRecord
from hami.dra.reservations import QuotaReservations, Reservation, claim_keys

JSON = dict[str, Any]


class QuotaView:
    """The cluster as DRA mode's quota checks see it. ``client``: lightkube
    ``AsyncClient``; ``config``: the scheduler's settings (NVIDIA's resource names);
    ``quota``: the scheduler's namespace quota ledger (limits only are used; None: no
    namespace is limited); ``reservations``: the claims admitted across replicas and the
    pod-claim records (None: neither)."""

    def __init__(self, client: Any, config: SchedulerConfig, quota: QuotaLedger | None = None,
                 reservations: QuotaReservations | None = None) -> None:
        self.client = client
        self.config = config
        self.quota = quota
        self.reservations = reservations

    async def published(self) -> tuple[set[int], set[tuple[str, int]]]:
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

    async def published_devices(self) -> dict[tuple[str, str], tuple[int, int | None]]:
        """:func:`hami.dra.cache.published_devices` of the watched slices, or of one LIST
        before the watch has synced."""
        devices = DraObjects.shared(self.client).published_devices()
        if devices is None:
            from lightkube.resources.resource_v1 import ResourceSlice

            devices = published_devices([s.to_dict()
                                         async for s in self.client.list(ResourceSlice)])
        return devices

    async def namespace_ledger(self, namespace: str, whole_card_mib: int,
                                claims: dict[str, JSON] | None = None, *,
                                reserved: Sequence[Reservation] = (),
                                records: Sequence[PodClaimRecord] | None = None
                                ) -> NamespaceLedger | None:
        """A ledger with the namespace's limits and the bookings of all its current
        claims, hami's and those the tenant made itself, allocated or not
        (:func:`hami.dra.booking.claim_booking_of`; whole cards of unallocated claims,
        and allocated devices no published slice holds, at ``whole_card_mib``), plus the
        ``reserved`` claims no listed claim matches (admitted, not stored yet). The claims
        the resourceclaim controller made for a pod (``records``; None: read from the
        namespace's Lease) book as their pod (:func:`hami.dra.podclaims.namespace_charge`,
        the namespace's pods listed once when there are records). Its ``describe`` names the
        claims booked as the largest card for a missing device, so a denial they tip says
        why; ``held``, ``pods``, ``records`` and ``listed_keys`` keep what it counted.
        ``claims``, when given, receives every listed claim by name."""
        if self.quota is None or not self.quota.limited(namespace):
            return None
        from lightkube.resources.core_v1 import Pod
        from lightkube.resources.resource_v1 import ResourceClaim

        limits = self.quota.quota(namespace)
        ledger = NamespaceLedger(self.config.registry[names.NVIDIA].resource_names())
        hard, gpu = {}, nvidia.settings(self.config)
        if limits.memory_limit_mib is not None:
            hard[f"limits.{gpu.resource_memory_name}"] = limits.memory_limit_mib
        if limits.cores_limit_percent is not None:
            hard[f"limits.{gpu.resource_core_name}"] = limits.cores_limit_percent
        ledger.set_quota(namespace, "gpu", hard)
        devices = await self.published_devices()
        # Every claim: a tenant allowed to create claims makes them without our templates.
        async for claim in self.client.list(ResourceClaim, namespace=namespace):
            doc = claim.to_dict()
            name = str((doc.get("metadata") or {}).get("name") or "")
            b = booking.claim_booking_of(doc, whole_card_mib, devices)
            ledger.held.append(podclaims.held_of(doc, (b.memory_mib, b.cores_percent)))
            ledger.listed_keys |= claim_keys(doc)
            if b.unknown:
                ledger.notes.append(
                    f"ResourceClaim {namespace}/{name} holds {', '.join(b.unknown)}, which no "
                    f"published ResourceSlice holds: booked as the largest published card "
                    f"({whole_card_mib} MiB, {booking.WHOLE_CARD_CORES_PERCENT}% cores) each")
            if claims is not None:
                claims[name] = doc
        for r in reserved:
            if r.key not in ledger.listed_keys:
                ledger.pending += 1
                ledger.held.append(podclaims.Held(
                    r.key, r.key.removeprefix("uid:") if r.key.startswith("uid:") else "",
                    r.memory_mib, r.cores_percent))
        if records is None:
            records = (await self.reservations.records(namespace)
                       if self.reservations is not None else [])
        ledger.records = list(records)
        if ledger.records:  # the claim being checked may be the one recorded
            ledger.pods = [p.to_dict() async for p in self.client.list(Pod, namespace=namespace)]
        charge = ledger.charge_of()
        ledger.grouped = charge.grouped
        ledger.charge(namespace, charge.memory_mib, charge.cores_percent)
        return ledger


__all__ = ["QuotaView"]
