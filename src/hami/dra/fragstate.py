"""Per-claim incremental state of DRA mode's ``fragmentation-aware`` scores.

:class:`hami.dra.fragscore.DraFragmentation` needs the shareable cards with their free
share (:func:`hami.dra.fragscore.cards`) and the tasks of the pods holding allocated
claims. Recomputing both from every slice and claim on each change cost 62-229 ms per
call at 2,000 claims (100-1,000 nodes). :class:`FragState` keeps them per object
instead: the watch cache (:class:`hami.dra.cache.DraObjects`) replaces an object's dict
on each event, so a refresh compares each slice and claim with the one it saw by
identity and redoes only what changed: a changed claim moves its consumption between
cards and its pod's task; a changed slice rebuilds the cards (slices change when a node
publishes, rarely). The result equals the full recomputation (tests compare both).
Pure (no I/O).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.fragmentation import WHOLE
from hami.core.fragmentation.learn import Task
from hami.dra import usage
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB, SHARES

__all__ = ["FragState"]

_Key = tuple[str, str]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _key(obj: Mapping[str, Any]) -> _Key:
    meta = _map(obj.get("metadata"))
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class _Base:
    """One shareable card as published: node, ``index``, totals, health."""

    __slots__ = ("cordoned", "cores", "healthy", "index", "memory_mib", "node", "shares")

    def __init__(self, node: str, dev: Mapping[str, Any]) -> None:
        view = usage._card(dev)
        self.node, self.index = node, int(view["index"])
        self.memory_mib = int(view["memory_mib"]["total"])
        self.cores, self.shares = int(view["cores"]["total"]), int(view["tasks"]["total"])
        self.healthy, self.cordoned = bool(view["health"]), bool(view["cordoned"])


class FragState:
    """Cards (with free shares) and running tasks, refreshed per changed object."""

    def __init__(self) -> None:
        from hami.dra import fragscore

        self._fs = fragscore
        self._slices: dict[_Key, Mapping[str, Any]] = {}
        #: (pool, device) -> the card as published, for shareable cards only
        self._base: dict[tuple[str, str], _Base] = {}
        self._order: list[tuple[str, str]] = []
        #: claim -> (the dict seen, its charges [(pool, device), mem, cores, shares],
        #: owning pod UID or "" when not allocated, its requests)
        self._claims: dict[_Key, tuple[Mapping[str, Any], list[tuple[tuple[str, str], int,
                                                                       int, int]],
                                       str, list[Any]]] = {}
        self._used: dict[tuple[str, str], list[int]] = {}
        self._pods: dict[str, set[_Key]] = {}
        self._cards: dict[tuple[str, str], Any] = {}
        self.ref_mib = 0
        self.running: dict[str, Task] = {}
        self.by_key: dict[_Key, Mapping[str, Any]] = {}
        #: id() of each claim dict seen -> its key
        self._ids: dict[int, _Key] = {}

    def cards(self) -> list[Any]:
        """The :class:`hami.dra.fragscore.Card` list, in node then index order."""
        return [self._cards[k] for k in self._order if k in self._cards]

    def refresh(self, slices: Iterable[Mapping[str, Any]],
                claims: Iterable[Mapping[str, Any]]) -> None:
        """Bring the state up to ``slices`` and ``claims`` (the dicts of the watch cache:
        an unchanged object is the same dict)."""
        slice_list = [s for s in slices if isinstance(s, Mapping)]
        if {id(s) for s in slice_list} != {id(s) for s in self._slices.values()}:
            self._rebuild({_key(s): s for s in slice_list})
            self._claims, self._used, self._pods, self.running = {}, {}, {}, {}
            self._cards, self._ids, self.by_key = {}, {}, {}
        # An object seen is held here, so its id() is not reused while it is known.
        current = {id(c): c for c in claims}
        touched_cards: set[tuple[str, str]] = set()
        touched_pods: set[str] = set()
        for gone in [i for i in self._ids if i not in current]:
            key = self._ids.pop(gone)
            if self.by_key.get(key) is not None and id(self.by_key[key]) == gone:
                del self.by_key[key]
                self._drop(key, touched_cards, touched_pods)
        for i, claim in current.items():
            if i in self._ids or not isinstance(claim, Mapping):
                continue
            key = _key(claim)
            self._ids[i] = key
            if key in self._claims:
                self._drop(key, touched_cards, touched_pods)
            self.by_key[key] = claim
            self._add(key, claim, touched_cards, touched_pods)
        if not self._cards:
            touched_cards = set(self._base)
        for k in touched_cards:
            self._card(k)
        for uid in touched_pods:
            keys = self._pods.get(uid)
            if keys:
                reqs = [r for k in sorted(keys) for r in self._claims[k][3]]
                self.running[uid] = self._fs.task_of(reqs, self.ref_mib)
            else:
                self.running.pop(uid, None)
                self._pods.pop(uid, None)

    def _rebuild(self, slice_map: dict[_Key, Mapping[str, Any]]) -> None:
        self._slices = slice_map
        self._base = {}
        for s in slice_map.values():
            spec = _map(s.get("spec"))
            if spec.get("driver") != DRIVER or not spec.get("nodeName"):
                continue
            node = str(spec["nodeName"])
            pool = str(_map(spec.get("pool")).get("name") or node)
            for dev in spec.get("devices") or []:
                if (isinstance(dev, Mapping) and dev.get("name")
                        and usage.instance_profile(dev) is None):
                    self._base[(pool, str(dev["name"]))] = _Base(node, dev)
        self._order = sorted(self._base, key=lambda k: (self._base[k].node,
                                                        self._base[k].index))
        self.ref_mib = max((b.memory_mib for b in self._base.values() if b.memory_mib > 0),
                           default=0)

    def _add(self, key: _Key, claim: Mapping[str, Any], touched_cards: set[tuple[str, str]],
             touched_pods: set[str]) -> None:
        results = _map(_map(_map(claim.get("status")).get("allocation")).get("devices")
                       ).get("results")
        charges = []
        for r in results if isinstance(results, list) else []:
            if not isinstance(r, Mapping) or r.get("driver") != DRIVER:
                continue
            dev = (str(r.get("pool")), str(r.get("device")))
            if dev not in self._base:
                continue
            used = _map(r.get("consumedCapacity"))
            mem, cores = usage._q(used.get(MEMORY)) // MIB, usage._q(used.get(CORES))
            shares = usage._q(used.get(SHARES))
            charges.append((dev, mem, cores, shares))
            sums = self._used.setdefault(dev, [0, 0, 0])
            sums[0] += mem
            sums[1] += cores
            sums[2] += shares
            touched_cards.add(dev)
        uid = self._fs._owner_uid(claim) if self._fs._allocated(claim) else ""
        reqs = self._fs.claim_requests(claim) if uid else []
        self._claims[key] = (claim, charges, uid, reqs)
        if uid:
            self._pods.setdefault(uid, set()).add(key)
            touched_pods.add(uid)

    def _drop(self, key: _Key, touched_cards: set[tuple[str, str]],
              touched_pods: set[str]) -> None:
        _, charges, uid, _ = self._claims.pop(key)
        for dev, mem, cores, shares in charges:
            sums = self._used.get(dev)
            if sums is not None:
                sums[0] -= mem
                sums[1] -= cores
                sums[2] -= shares
            touched_cards.add(dev)
        if uid:
            self._pods.get(uid, set()).discard(key)
            touched_pods.add(uid)

    def _card(self, k: tuple[str, str]) -> None:
        base = self._base[k]
        if base.memory_mib <= 0:
            self._cards.pop(k, None)
            return
        mem_used, cores_used, tasks_used = self._used.get(k, (0, 0, 0))
        free = WHOLE * max(base.memory_mib - mem_used, 0) // base.memory_mib
        if base.cores > 0:
            free = min(free, WHOLE * max(base.cores - cores_used, 0) // base.cores)
        if not base.healthy or base.cordoned or tasks_used >= max(base.shares, 1):
            free = 0
        self._cards[k] = self._fs.Card(base.node, base.memory_mib, free)
