"""DRA mode's cards and claims as the ledger the ``fragmentation-aware`` scorer reads.

Extender mode ranks nodes with :class:`hami.core.fragmentation.LiveFragmentationOrder`
over a :class:`~hami.core.ledger.UsageLedger`. DRA mode has no ledger: its usage is in
the ResourceClaims' allocation results. :class:`DraLedger` keeps, from our
ResourceSlices and the ResourceClaims, exactly the arrays
:class:`~hami.core.fragmentation.state.FragmentationState` reads from a ledger, so that
DRA mode's ``/prioritize`` calls the same scorer (the FGD growth, the GPU-model
pressure, the CPU/memory stranding and the whole-node guard) with the same learned mix.

Per card (a shareable device of our slices; MIG-mode instance devices and cards without
``memory`` are left out) its free share in milli-GPU is what extender mode's ledger
gives as ``1000 x free cores / cores``; here it is the scarcer of free ``memory`` and
free ``cores`` (``1000 x free / capacity``, each, the sums of the ``consumedCapacity``
of the allocation results on it), 0 when the card is tainted (unhealthy, cordoned) or
all its ``shares`` are taken. So ``total_cores`` is 1000 and ``used_cores`` 1000 less
that share. Node CPU and memory are not part of DRA's objects: they come from a
:class:`~hami.dra.hosts.HostUsage` (the scheduler's Node and Pod watches) when one is
given, else they read as unchecked (``-1``: the CPU/memory terms add nothing).

:meth:`DraLedger.sync` is incremental per object: a claim whose object is the one seen
before (the watch cache replaces a claim's dict on each event) costs one identity test;
a new, changed or deleted claim moves only its own results, and stamps the nodes they
are on (``changed_nodes``), so the scorer recomputes those nodes only. A changed slice
rebuilds the card index (``version``), as a re-registered node does in extender mode.
Pure (no I/O).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hami.core.fragmentation import WHOLE, IntArray
from hami.core.fragmentation.learn import Task
from hami.core.podobjects import list_or_empty, mapping_or_empty
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra import usage
from hami.dra.hosts import HostUsage
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB, SHARES

Key = tuple[str, str]


def _q(raw: Any) -> int:
    try:
        return max(int(to_int_exact(quantity(raw)) or 0), 0)
    except (QuantityError, ValueError, TypeError):
        return 0


def object_key(obj: Any) -> Key:
    """``(namespace, name)`` of an API object (``("", "")`` when malformed)."""
    meta = mapping_or_empty(mapping_or_empty(obj).get("metadata"))
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def keyed(objs: Mapping[Key, Any] | Iterable[Any]) -> dict[Key, Any]:
    """``objs`` by key: a mapping as it is; a list keyed by :func:`object_key`, a repeated
    or missing key made distinct by its position (each object counts once)."""
    if isinstance(objs, Mapping):
        return dict(objs)
    out: dict[Key, Any] = {}
    for i, obj in enumerate(objs):
        key = object_key(obj)
        out[key if key[1] and key not in out else (key[0], f"{key[1]}#{i}")] = obj
    return out


def owner_uid(claim: Mapping[str, Any]) -> str:
    """The UID of the Pod owning a claim (made from a template), else ``claim:ns/name``."""
    meta = mapping_or_empty(claim.get("metadata"))
    for ref in list_or_empty(meta.get("ownerReferences")):
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and ref.get("uid"):
            return str(ref["uid"])
    return f"claim:{meta.get('namespace')}/{meta.get('name')}"


@dataclass(frozen=True, slots=True)
class _ClaimUse:
    """What one claim object adds: ``(card, memory MiB, cores %, shares)`` per result on
    one of our cards, the owner's UID and the claim's requests (when allocated)."""

    obj: Any
    results: tuple[tuple[int, int, int, int], ...]
    owner: str
    requests: tuple[Any, ...]


class DraLedger:
    """Cards, their usage and the running tasks from DRA objects, in the fields of a
    :class:`~hami.core.ledger.UsageLedger` that
    :class:`~hami.core.fragmentation.state.FragmentationState` and
    :class:`~hami.core.fragmentation.learn.LiveFragmentationOrder` read (module
    docstring). Nodes are those with a ResourceSlice of our driver, in name order; cards
    in node then slice order.

    ``requests_of(claim) -> list[Request]`` and ``task_of(requests, card MiB) -> Task``
    come from :mod:`hami.dra.fragscore` (the claim's requests and their task).
    """

    def __init__(self, requests_of: Any, task_of: Any) -> None:
        self._requests_of = requests_of
        self._task_of = task_of
        #: Bumped when the card set changes (a slice added, changed or removed).
        self.version = 0
        #: Bumped at each claim change; ``changed_nodes(seq)`` are those stamped since.
        self.usage_seq = 0
        #: Bumped when the running tasks change (claims allocated or released).
        self.version_pods = 0
        self.type_names: list[str] = []
        self._slices: dict[Key, Any] = {}
        self._claims: dict[Key, _ClaimUse] = {}
        self._by_owner: dict[str, set[Key]] = {}
        self._hosts: HostUsage | None = None
        self._hosts_seq = -1
        self._build({})

    # ---------------------------------------------------------------- structure
    def _build(self, slices: dict[Key, Any]) -> None:
        cards: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for s in slices.values():
            spec = mapping_or_empty(mapping_or_empty(s).get("spec"))
            if spec.get("driver") != DRIVER or not spec.get("nodeName"):
                continue
            node = str(spec["nodeName"])
            pool = str(mapping_or_empty(spec.get("pool")).get("name") or node)
            for dev in list_or_empty(spec.get("devices")):
                if not isinstance(dev, Mapping) or not dev.get("name") \
                        or usage.instance_profile(dev) is not None:
                    continue
                caps = mapping_or_empty(dev.get("capacity"))
                total = {k: _q(mapping_or_empty(caps.get(k)).get("value"))
                         for k in (MEMORY, CORES, SHARES)}
                if total[MEMORY] // MIB <= 0:
                    continue
                view = usage._card(dev)  # health, cordon and type as hami top reads them
                cards.setdefault(node, []).append((f"{pool}\0{dev['name']}", {
                    "memory": total[MEMORY] // MIB, "cores": total[CORES],
                    "shares": total[SHARES], "usable": view["health"] and not view["cordoned"],
                    "type": view["type"]}))
        self.names = sorted(cards)
        self.index = {n: i for i, n in enumerate(self.names)}
        rows = [(i, key, c) for i, n in enumerate(self.names) for key, c in cards[n]]
        m, n = len(rows), len(self.names)
        self.size = m
        self.node_count = n
        self._card = {key: d for d, (_, key, _) in enumerate(rows)}
        self.node_of: IntArray = np.array([r[0] for r in rows], dtype=np.int64)
        self.card_mib: IntArray = np.array([r[2]["memory"] for r in rows], dtype=np.int64)
        self._cap_cores = [r[2]["cores"] for r in rows]
        self._cap_shares = [r[2]["shares"] for r in rows]
        self._usable = [bool(r[2]["usable"]) for r in rows]
        self.type_names = sorted({r[2]["type"] for r in rows})
        tid = {t: k for k, t in enumerate(self.type_names)}
        self.type_id: IntArray = np.array([tid[r[2]["type"]] for r in rows], dtype=np.int64)
        self.total_cores: IntArray = np.full(m, WHOLE, dtype=np.int64)
        self.used_cores: IntArray = np.zeros(m, dtype=np.int64)
        self.healthy = np.ones(m, dtype=np.bool_)
        self.used_slots: IntArray = np.zeros(m, dtype=np.int64)
        self.split_count: IntArray = np.maximum(
            np.array(self._cap_shares, dtype=np.int64), 1)
        self._used = [[0, 0, 0] for _ in range(m)]  # memory MiB, cores %, shares
        #: Per node the largest card's memory (MiB; 0 without cards).
        self.node_card_mib: IntArray = np.zeros(n, dtype=np.int64)
        if m:
            np.maximum.at(self.node_card_mib, self.node_of, self.card_mib)
        self.ref_mib = int(self.card_mib.max()) if m else 0
        self.cpu_milli_total: IntArray = np.full(n, -1, dtype=np.int64)
        self.memory_mib_total: IntArray = np.full(n, -1, dtype=np.int64)
        self.cpu_milli_used: IntArray = np.zeros(n, dtype=np.int64)
        self.memory_mib_used: IntArray = np.zeros(n, dtype=np.int64)
        self._stamp: IntArray = np.zeros(n, dtype=np.int64)
        for d in range(m):
            self._set_free(d)
        self._slices = slices
        self._claims = {}
        self._by_owner = {}
        self._hosts_seq = -1
        self.version += 1

    def _set_host(self, i: int, hosts: HostUsage) -> None:
        cpu_total, mem_total, cpu_used, mem_used = hosts.of(self.names[i])
        self.cpu_milli_total[i], self.memory_mib_total[i] = cpu_total, mem_total
        self.cpu_milli_used[i], self.memory_mib_used[i] = cpu_used, mem_used

    def _set_free(self, d: int) -> None:
        mem_used, cores_used, shares_used = self._used[d]
        mem_total, cores_total = int(self.card_mib[d]), self._cap_cores[d]
        free = WHOLE * max(mem_total - mem_used, 0) // mem_total
        if cores_total > 0:
            free = min(free, WHOLE * max(cores_total - cores_used, 0) // cores_total)
        if not self._usable[d] or shares_used >= max(self._cap_shares[d], 1):
            free = 0
        self.used_cores[d] = WHOLE - free

    # ------------------------------------------------------------------- claims
    def _use_of(self, claim: Any) -> _ClaimUse:
        c = mapping_or_empty(claim)
        alloc = mapping_or_empty(mapping_or_empty(c.get("status")).get("allocation"))
        found = []
        for r in list_or_empty(mapping_or_empty(alloc.get("devices")).get("results")):
            if not isinstance(r, Mapping) or r.get("driver") != DRIVER:
                continue
            d = self._card.get(f"{r.get('pool')}\0{r.get('device')}")
            if d is None:
                continue
            used = mapping_or_empty(r.get("consumedCapacity"))
            found.append((d, _q(used.get(MEMORY)) // MIB, _q(used.get(CORES)),
                          _q(used.get(SHARES))))
        allocated = bool(list_or_empty(mapping_or_empty(alloc.get("devices")).get("results")))
        return _ClaimUse(claim, tuple(found), owner_uid(c) if allocated else "",
                         tuple(self._requests_of(c)) if allocated else ())

    def _apply(self, use: _ClaimUse, sign: int, touched: set[int], key: Key) -> None:
        for d, mem, cores, shares in use.results:
            u = self._used[d]
            u[0] += sign * mem
            u[1] += sign * cores
            u[2] += sign * shares
            touched.add(d)
        if use.owner:
            keys = self._by_owner.setdefault(use.owner, set())
            (keys.add if sign > 0 else keys.discard)(key)
            if not keys:
                del self._by_owner[use.owner]
            self.version_pods += 1

    def sync(self, slices: Mapping[Key, Any] | Iterable[Any],
             claims: Mapping[Key, Any] | Iterable[Any], hosts: HostUsage | None = None
             ) -> None:
        """Bring the ledger up to ``slices`` and ``claims`` (the watch cache's dicts by
        ``(namespace, name)``, or lists) and the nodes' CPU and memory in ``hosts``
        (refreshed by the caller). Objects that are the very objects seen before count
        as unchanged (module docstring)."""
        now_slices = keyed(slices)
        if now_slices.keys() != self._slices.keys() or any(
                obj is not self._slices[k] for k, obj in now_slices.items()):
            self._build(now_slices)
        now = keyed(claims)
        touched: set[int] = set()
        seen = self._claims
        for key in [k for k in seen if k not in now]:
            self._apply(seen.pop(key), -1, touched, key)
        for key, obj in now.items():
            old = seen.get(key)
            if old is not None and old.obj is obj:
                continue
            if old is not None:
                self._apply(old, -1, touched, key)
            use = seen[key] = self._use_of(obj)
            self._apply(use, 1, touched, key)
        nodes: set[int] = set()
        if hosts is not None and (hosts is not self._hosts or hosts.seq != self._hosts_seq):
            changed = (range(self.node_count) if hosts is not self._hosts or self._hosts_seq < 0
                       else [i for i in map(self.index.get, hosts.changed(self._hosts_seq))
                             if i is not None])
            for i in changed:
                self._set_host(i, hosts)
                nodes.add(i)
            self._hosts, self._hosts_seq = hosts, hosts.seq
        if touched or nodes:
            self.usage_seq += 1
            for d in touched:
                u = self._used[d]
                self.used_slots[d] = u[2]
                self._set_free(d)
            nodes.update(self.node_of[sorted(touched)].tolist())
            self._stamp[sorted(nodes)] = self.usage_seq

    # ---------------------------------------------------------- ledger fields
    def changed_nodes(self, since: int) -> IntArray:
        """Nodes whose cards' usage changed after usage sequence ``since``."""
        return np.flatnonzero(self._stamp > since)

    def free_milli(self) -> IntArray:
        """``[cards]`` each card's free share (milli-GPU), as the scorer reads it."""
        usable = self.used_slots < self.split_count
        return np.where(usable, self.total_cores - self.used_cores, 0)

    def claim(self, key: Key) -> Any:
        """The claim object seen last under ``key`` (None: unknown)."""
        use = self._claims.get(key)
        return None if use is None else use.obj

    def running_tasks(self, skip: Any = ()) -> list[Task]:
        """One task per pod holding allocated claims (UIDs in ``skip`` left out): its
        claims' requests as one placement against the largest card, for
        :meth:`hami.core.fragmentation.LiveFragmentationOrder.scorer_for`."""
        out = []
        hosts = self._hosts
        for uid, keys in self._by_owner.items():
            if uid in skip:
                continue
            reqs = [r for k in keys for r in self._claims[k].requests]
            if reqs:
                task = self._task_of(reqs, self.ref_mib)
                held = hosts.requests_of(uid) if hosts is not None else None
                out.append(task if held is None else (task[0], task[1], *held, task[4]))
        return out

    def indices(self, names: Iterable[str]) -> IntArray:
        """Node indices of ``names`` (-1 for a node without our cards)."""
        get = self.index.get
        return np.fromiter((get(n, -1) for n in names), dtype=np.int64)

