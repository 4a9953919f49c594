"""DRA mode's namespace GPU quota under concurrency: every ResourceClaim admitted in a
namespace with a GPU quota is reserved on one API object per namespace, written with
optimistic concurrency, so claims created in the same instant, on any scheduler replica,
are checked one after another.

Why an API object and not the leader: every replica behind the webhook Service answers
admission (the chart's HA setting runs two), and a reservation kept in one process is
invisible to the other. The API server already serialises writes to one object: a
replace carrying the ``resourceVersion`` it read fails with 409 when another write came
first. Forwarding every review to the leader would add a hop and a second failure
domain to admission; a Lease per namespace costs one GET and one replace per claim.

The object: the Lease ``hami-dra-quota-<namespace>`` in the scheduler's own namespace
(tenants cannot write it), annotation :data:`ANNOTATION` holding the live reservations
as JSON ``[[key, memory MiB, cores %, unix time], ...]``. A claim's check (:meth:`
QuotaReservations.reserve`): read the Lease, list the namespace's claims, count the
claims plus every reservation younger than :data:`TTL_S` whose claim is not listed yet,
and, when the new claim fits, replace the Lease with its reservation added (reservations
whose claim is listed, or older than the TTL, are dropped); a 409 starts again. A
reservation is matched to its claim by :func:`claim_keys` (the claim's name, or for a
claim the resourceclaim controller makes under a generated name, its pod's UID and the
pod's entry name); a claim refused after admission (another webhook, the API's
validation) keeps its reservation until the TTL, which can only refuse more, never admit
more.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.podobjects import mapping_or_empty
from hami.dra import podclaims
from hami.dra.podclaims import PodClaimRecord

log = logging.getLogger(__name__)

__all__ = ["ANNOTATION", "TTL_S", "QuotaReservations", "Reservation", "claim_keys",
           "new_claim_key"]

#: The Lease annotation holding the reservations.
ANNOTATION = "hami.io/dra-quota-reservations"
#: How long a reservation counts without its claim being listed (seconds): longer than
#: the API server's webhook timeout (10 s by default), so the claim is stored by then.
TTL_S = 30.0
#: The resourceclaim controller's annotation on a pod's claim: the pod's entry name.
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
#: Replace attempts before giving up (a review's deadline bounds it too).
ATTEMPTS = 64


@dataclass(frozen=True, slots=True)
class Reservation:
    """One admitted claim not yet counted from the claim list: ``key``
    (:func:`claim_keys`), what it asks (``memory_mib``, ``cores_percent``) and when it
    was admitted (``at``, unix seconds)."""

    key: str
    memory_mib: int
    cores_percent: int
    at: float


def _pod_key(meta: Mapping[str, Any]) -> str | None:
    entry = mapping_or_empty(meta.get("annotations")).get(POD_CLAIM_NAME)
    owners = [o for o in meta.get("ownerReferences") or []
              if isinstance(o, Mapping) and o.get("kind") == "Pod" and o.get("uid")]
    if isinstance(entry, str) and entry and len(owners) == 1:
        return f"pod:{owners[0]['uid']}/{entry}"
    return None


def claim_keys(claim: Mapping[str, Any]) -> set[str]:
    """The keys a stored ResourceClaim (a dict) matches a reservation by:
    ``name:<name>``, ``uid:<UID>``, and ``pod:<pod UID>/<entry>`` for a claim with the
    resourceclaim controller's annotation and one owning Pod. Pure; never raises."""
    meta = mapping_or_empty(claim.get("metadata"))
    keys = {f"name:{meta['name']}"} if isinstance(meta.get("name"), str) else set()
    if isinstance(meta.get("uid"), str) and meta["uid"]:
        keys.add(f"uid:{meta['uid']}")
    pod = _pod_key(meta)
    if pod:
        keys.add(pod)
    return keys


def new_claim_key(claim: Mapping[str, Any], review_uid: str) -> str:
    """The key of a claim being admitted: its UID (a validating webhook's review
    carries the one the API server assigned), else its pod key (a mutating webhook's
    review of a generated name knows neither), else its name, else one no claim matches
    (``review:<uid>``: the reservation lasts its TTL). Pure; never raises."""
    meta = mapping_or_empty(claim.get("metadata"))
    if isinstance(meta.get("uid"), str) and meta["uid"]:
        return f"uid:{meta['uid']}"
    pod = _pod_key(meta)
    if pod:
        return pod
    if isinstance(meta.get("name"), str) and meta["name"]:
        return f"name:{meta['name']}"
    return f"review:{review_uid}"


def parse(text: Any) -> list[Reservation]:
    """The reservations of an :data:`ANNOTATION` value; entries that are not of the
    written shape are dropped (hami writes it; a malformed value counts as none)."""
    try:
        raw = json.loads(text) if isinstance(text, str) else []
    except ValueError:
        return []
    out = []
    for item in raw if isinstance(raw, list) else []:
        if (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)
                and all(isinstance(v, int | float) and not isinstance(v, bool)
                        for v in item[1:])):
            out.append(Reservation(item[0], int(item[1]), int(item[2]), float(item[3])))
    return out


def dump(reservations: list[Reservation]) -> str:
    """The :data:`ANNOTATION` value for ``reservations``."""
    return json.dumps([[r.key, r.memory_mib, r.cores_percent, round(r.at, 3)]
                       for r in reservations], separators=(",", ":"))


#: ``check(reservations, records)`` -> (the denial or None, the :func:`claim_keys` of the
#: claims it listed); it counts the listed claims plus the reservations whose key none of
#: them has, grouping the claims ``records`` (:mod:`hami.dra.podclaims`) name under their
#: pods.
Check = Callable[[list[Reservation], list[PodClaimRecord]],
                 Awaitable[tuple[str | None, set[str]]]]


class QuotaReservations:
    """Reservations on the Leases of ``namespace`` (the scheduler's own); ``client``:
    lightkube ``AsyncClient``; ``clock``: unix seconds."""

    def __init__(self, client: Any, namespace: str, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.namespace = namespace
        self.ttl_s = ttl_s
        self.clock = clock
        #: Replaces answered 409 (contention between reviews; for tests and metrics).
        self.conflicts = 0

    @staticmethod
    def lease_name(tenant_namespace: str) -> str:
        """The Lease serialising ``tenant_namespace``'s claims."""
        return f"hami-dra-quota-{tenant_namespace}"

    async def _lease(self, name: str) -> Any:
        from lightkube import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.coordination_v1 import Lease

        try:
            return await self.client.get(Lease, name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
        try:
            return await self.client.create(
                Lease(metadata=ObjectMeta(name=name, namespace=self.namespace,
                                          labels={"app.kubernetes.io/component":
                                                  "hami-scheduler"})),
                namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 409:
                raise
        return await self.client.get(Lease, name, namespace=self.namespace)

    async def records(self, tenant_namespace: str) -> list[PodClaimRecord]:
        """The pod-claim records (:mod:`hami.dra.podclaims`) on ``tenant_namespace``'s
        Lease; [] when there is no Lease. One GET.

        Raises:
            lightkube ``ApiError`` (other than 404) or ``httpx`` errors.
        """
        from lightkube import ApiError
        from lightkube.resources.coordination_v1 import Lease

        try:
            lease = await self.client.get(Lease, self.lease_name(tenant_namespace),
                                          namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            return []
        return podclaims.parse((lease.metadata.annotations or {}).get(podclaims.ANNOTATION))

    async def reserve(self, tenant_namespace: str, key: str, asks: tuple[int, int],
                      check: Check, record: PodClaimRecord | None = None) -> str | None:
        """Reserve ``asks`` (memory MiB, cores %) under ``key`` for a claim of
        ``tenant_namespace`` when ``check`` (given the reservations younger than the TTL
        and the pod-claim records, ``record`` included) finds no denial: None when
        reserved, else the denial. ``record``: the claim's pod-claim record when the
        resourceclaim controller created it, kept with the reservation (until its claim
        is gone, past the TTL). Retried from the read on every 409.

        Raises:
            lightkube ``ApiError`` (other than 404/409 handled here) or ``httpx``
            errors: the Lease or the claims cannot be read or written (the caller
            refuses: fail closed).
        """
        from lightkube import ApiError

        name = self.lease_name(tenant_namespace)
        for attempt in range(ATTEMPTS):
            lease = await self._lease(name)
            annotations = dict(lease.metadata.annotations or {})
            now = self.clock()
            stored = parse(annotations.get(ANNOTATION))
            young = [r for r in stored
                     if now - self.ttl_s < r.at <= now + self.ttl_s and r.key != key]
            held = [r for r in podclaims.parse(annotations.get(podclaims.ANNOTATION))
                    if record is None or r.claim_uid != record.claim_uid]
            # a record the Lease has no room for is not used: its claim counts in full
            ours = record if record is not None and len(podclaims.dump(
                [*held, record])) <= podclaims.MAX_RECORDS_BYTES else None
            if record is not None and ours is None:
                log.warning("namespace %s: %d pod-claim records fill the Lease; claim %s "
                            "counts in full", tenant_namespace, len(held), record.claim_uid)
            denial, listed = await check(young, held + ([ours] if ours else []))
            live = [r for r in young if r.key not in listed]
            # a record stays while its claim is listed, or young (not stored yet); a
            # claim's UID never comes back once the claim is gone
            kept = [r for r in held if f"uid:{r.claim_uid}" in listed
                    or now - self.ttl_s < r.at <= now + self.ttl_s]
            if denial is None:
                live.append(Reservation(key, asks[0], asks[1], now))
                if ours is not None:
                    kept.append(ours)
            elif len(live) == len(stored) and len(kept) == len(held):
                return denial
            # written on a denial too when it drops reservations whose claim is listed
            # (deleted later, that claim must not count again through its reservation)
            annotations[ANNOTATION] = dump(live)
            annotations[podclaims.ANNOTATION] = podclaims.dump(kept)
            lease.metadata.annotations = annotations
            try:
                await self.client.replace(lease, namespace=self.namespace)
                return denial
            except ApiError as exc:
                if exc.status.code != 409:
                    raise
                if denial is not None:
                    return denial  # someone else wrote: what it dropped is its business
            self.conflicts += 1
            await asyncio.sleep(min(0.005 * (attempt + 1), 0.1))
        return (f"the GPU quota of namespace {tenant_namespace} could not be reserved after "
                f"{ATTEMPTS} attempts (too many claims at once); try again")
