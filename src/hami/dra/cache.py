"""Watched copies of the ResourceSlices and ResourceClaims for DRA mode's scheduler side.

``/prioritize`` needs every node's card memory and what allocated claims consume;
``/webhook`` needs a namespace's claims (quota) and the card sizes (whole-card bookings,
percentages). Listing them on every call costs the API server a full LIST of both kinds
per pod; :class:`DraObjects` lists each kind once and then follows a watch (bookmarks
and idle deadline from :mod:`hami.kubehttp` when the client was made by
:meth:`hami.kube.Kube.connect`), relisting after any watch error. The per-node memory
totals are kept up to date at each event, so a score costs no pass over the cluster.

Until the first list of a kind has arrived, callers get ``None`` (they list directly).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from hami.dra import policy, usage
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: ``timeoutSeconds`` of each watch request: the API server ends the watch then and it
#: is resumed from the last version (half of kubehttp's default idle deadline).
WATCH_TIMEOUT_S = 60


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class DraObjects:
    """Our ResourceSlices and every ResourceClaim, watched (one instance per client:
    :meth:`shared`). ``start`` begins the watches on the running event loop."""

    _shared: ClassVar[weakref.WeakKeyDictionary[Any, DraObjects]] = weakref.WeakKeyDictionary()

    def __init__(self, client: Any) -> None:
        self.client = client
        self.slices: dict[tuple[str, str], dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.synced = {"slices": asyncio.Event(), "claims": asyncio.Event()}
        # per-node totals (policy.memory_use, kept per event): each slice's part, the
        # node's slice count and capacity, each MIG card's memory per profile, each MIG
        # instance's memory and how many allocation results name it, each claim's
        # results, the memory used per pool
        self._parts: dict[tuple[str, str], policy.SliceMemory] = {}
        self._slice_count: dict[str, int] = defaultdict(int)
        self._cap: dict[str, int] = defaultdict(int)
        self._mig: dict[tuple[str, str], dict[str, int]] = {}
        self._instances: dict[tuple[str, str], int] = {}
        self._refs: dict[tuple[str, str], int] = defaultdict(int)
        self._results: dict[tuple[str, str], list[tuple[str, str, int]]] = {}
        self._used: dict[str, int] = defaultdict(int)
        self._tasks: list[asyncio.Task[None]] = []
        #: Watch errors and relists, for tests and logs.
        self.relists = 0
        #: Bumped at every event (callers cache what they derive from the objects).
        self.version = 0
        #: Bumped at every slice event; keys :attr:`_derived` (what every admission
        #: reads from the slices, recomputed once per change instead of once per review).
        self.slices_version = 0
        self._derived: dict[str, tuple[int, Any]] = {}

    @classmethod
    def shared(cls, client: Any) -> DraObjects:
        """The instance for ``client`` (created and started on first use; the webhook and
        ``/prioritize`` of one scheduler share it). Call from the event loop."""
        obj = cls._shared.get(client)
        if obj is None:
            obj = cls._shared[client] = cls(client)
        obj.start()
        return obj

    def start(self) -> None:
        """Start both watches (no-op when running)."""
        if self._tasks and not all(t.done() for t in self._tasks):
            return
        from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

        self._tasks = [asyncio.ensure_future(self._run(ResourceSlice, "slices")),
                       asyncio.ensure_future(self._run(ResourceClaim, "claims"))]

    async def stop(self) -> None:
        """Cancel the watches."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # ---------------------------------------------------------------- events
    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One event (``ADDED``/``MODIFIED``/``DELETED``) of ``kind`` (``slices`` or
        ``claims``); totals follow."""
        self.version += 1
        key = _key(obj)
        if kind == "slices":
            self.slices_version += 1
            self._put_part(key, None)
            if event == "DELETED":
                self.slices.pop(key, None)
                return
            if (obj.get("spec") or {}).get("driver") != DRIVER:
                return
            self.slices[key] = dict(obj)
            self._put_part(key, policy.slice_memory(obj))
            return
        for pool, device, consumed in self._results.pop(key, []):
            self._used[pool] -= consumed + self._instances.get((pool, device), 0)
            self._refs[(pool, device)] -= 1
            if not self._refs[(pool, device)]:
                del self._refs[(pool, device)]
        if event == "DELETED":
            self.claims.pop(key, None)
            return
        self.claims[key] = dict(obj)
        results = policy.claim_results(obj)
        if results:
            self._results[key] = results
        for pool, device, consumed in results:
            self._used[pool] += consumed + self._instances.get((pool, device), 0)
            self._refs[(pool, device)] += 1

    def _put_part(self, key: tuple[str, str], part: policy.SliceMemory | None) -> None:
        """Replace slice ``key``'s part of the totals with ``part`` (None: drop it)."""
        old = self._parts.pop(key, None)
        for sign, p in ((-1, old), (1, part)):
            if p is None:
                continue
            self._slice_count[p.node] += sign
            self._cap[p.node] += sign * p.cards_bytes
            for (uuid, profile), n in p.mig_bytes.items():
                sums = self._mig.setdefault((p.node, uuid), {})
                before = usage.mig_card_total(sums)
                sums[profile] = sums.get(profile, 0) + sign * n
                if not sums[profile]:
                    del sums[profile]
                self._cap[p.node] += usage.mig_card_total(sums) - before
                if not sums:
                    del self._mig[(p.node, uuid)]
            for ref, n in p.instances.items():  # results already naming it use it
                now = n if sign > 0 else 0
                self._used[ref[0]] += self._refs.get(ref, 0) * (now - self._instances.get(ref, 0))
                if sign > 0:
                    self._instances[ref] = n
                else:
                    self._instances.pop(ref, None)
        if part is not None:
            self._parts[key] = part
        if old is not None and not self._slice_count[old.node]:
            del self._slice_count[old.node], self._cap[old.node]

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        store = self.slices if kind == "slices" else self.claims
        listed = {_key(o) for o in items}
        for key in [k for k in store if k not in listed]:
            self.apply(kind, "DELETED", {"metadata": {"namespace": key[0], "name": key[1]}})
        for o in items:
            self.apply(kind, "ADDED", o)

    async def _run(self, res: Any, kind: str) -> None:
        namespaced = kind == "claims"
        ns: dict[str, Any] = {"namespace": "*"} if namespaced else {}
        delay = 0.2
        while True:
            try:
                listing = self.client.list(res, **ns)
                items = [o.to_dict() async for o in listing]
                self._replace(kind, items)
                version = str(listing.resourceVersion or "")
                self.synced[kind].set()
                delay = 0.2
                async for event, obj in self.client.watch(res, resource_version=version,
                                                          server_timeout=WATCH_TIMEOUT_S, **ns):
                    if event in ("ADDED", "MODIFIED", "DELETED"):
                        self.apply(kind, event, obj.to_dict())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - relist after any watch failure
                self.relists += 1
                log.info("DRA %s watch: %s; relisting", kind, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # ---------------------------------------------------------------- reads
    def memory_use(self) -> dict[str, tuple[int, int]] | None:
        """:func:`hami.dra.policy.memory_use` from the watched objects; None before both
        kinds were listed once."""
        if not all(e.is_set() for e in self.synced.values()):
            return None
        return {node: (self._used.get(node, 0), self._cap.get(node, 0))
                for node in self._slice_count}

    def metric_rows(self) -> tuple[list[usage.CardUse], list[usage.PodUse]] | None:
        """:func:`hami.dra.usage.metric_rows` of the watched objects (the scheduler's
        metrics, at each scrape: no API request); None before both kinds were listed
        once."""
        if not all(e.is_set() for e in self.synced.values()):
            return None
        return usage.metric_rows(self.slices.values(), self.claims.values())

    def claims_in(self, namespace: str) -> list[dict[str, Any]] | None:
        """The namespace's ResourceClaims; None before the first list."""
        if not self.synced["claims"].is_set():
            return None
        return [c for (ns, _), c in self.claims.items() if ns == namespace]

    def card_sizes_mib(self) -> set[int] | None:
        """The distinct ``memory`` capacities (MiB) of our published cards; None before
        the first list."""
        return self._of_slices("card_sizes_mib", card_sizes_mib)

    def published_devices(self) -> dict[tuple[str, str], tuple[int, int | None]] | None:
        """:func:`published_devices` of the watched slices; None before the first list."""
        return self._of_slices("published_devices", published_devices)

    def mig_offers(self) -> set[tuple[str, int]] | None:
        """:func:`mig_offers` of the watched slices; None before the first list."""
        return self._of_slices("mig_offers", mig_offers)

    def _of_slices(self, name: str, derive: Callable[[Any], _T]) -> _T | None:
        """``derive(slices)``, once per :attr:`slices_version` (a copy, so a caller that
        changes it changes nothing here); None before the first list."""
        if not self.synced["slices"].is_set():
            return None
        hit = self._derived.get(name)
        if hit is None or hit[0] != self.slices_version:
            hit = self._derived[name] = (self.slices_version, derive(self.slices.values()))
        return copy.copy(hit[1])


def _devices(slices: Any) -> Any:
    """Our slices' devices (dicts), with their ``profile`` attribute (None: a card)."""
    for s in slices:
        spec = (s.get("spec") or {}) if isinstance(s, Mapping) else {}
        if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER:
            continue
        for d in spec.get("devices") or []:
            if isinstance(d, Mapping):
                yield d, usage.instance_profile(d)


def _memory_mib(device: Mapping[str, Any]) -> int:
    return policy._q(((device.get("capacity") or {}).get(MEMORY) or {}).get("value")) // MIB


def card_sizes_mib(slices: Any) -> set[int]:
    """Distinct card ``memory`` capacities (MiB, rounded down) of our slices' shareable
    cards (MIG instance devices, which carry a ``profile`` attribute, are not cards)."""
    return {m for d, profile in _devices(slices) if profile is None
            and (m := _memory_mib(d)) > 0}


def mig_offers(slices: Any) -> set[tuple[str, int]]:
    """Distinct ``(profile, memory MiB)`` of the MIG instance devices our slices publish
    (:mod:`hami.dra.migslices`), whatever their taints and current allocations."""
    return {(str(profile), m) for d, profile in _devices(slices) if profile is not None
            and (m := _memory_mib(d)) > 0}


def published_devices(slices: Any) -> dict[tuple[str, str], tuple[int, int | None]]:
    """What each device of our slices books when an allocation holds it whole (the
    namespace quota, :func:`hami.dra.booking.claim_booking_of`): ``(pool, device name)
    -> (memory MiB, cores percent)``. A MIG instance device: its ``memory`` capacity and
    its ``coresPercent`` attribute (:mod:`hami.dra.migslices`; None when the slice has
    none, e.g. published by an older node plugin); a shareable card: its ``memory`` and
    ``cores`` capacities. Malformed values count 0."""
    out: dict[tuple[str, str], tuple[int, int | None]] = {}
    for s in slices:
        spec = (s.get("spec") or {}) if isinstance(s, Mapping) else {}
        if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER:
            continue
        pool_spec = spec.get("pool")
        pool = str((pool_spec.get("name") if isinstance(pool_spec, Mapping) else None)
                   or spec.get("nodeName") or "")
        for d in spec.get("devices") or []:
            if not isinstance(d, Mapping) or not d.get("name"):
                continue
            memory_mib = max(_memory_mib(d), 0)
            if usage.instance_profile(d) is None:
                cores = policy._q(((d.get("capacity") or {}).get(CORES) or {}).get("value"))
                out[(pool, str(d["name"]))] = (memory_mib, max(cores, 0))
                continue
            share = usage._attr(d, "coresPercent")
            out[(pool, str(d["name"]))] = (
                memory_mib, share if isinstance(share, int) and not isinstance(share, bool)
                and share >= 0 else None)
    return out
