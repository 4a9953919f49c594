"""Node policy ``fragmentation-aware`` in DRA mode: scores for the ``prioritize`` verb.

The same measure as extender mode's ``fragmentation-aware`` node order
(:mod:`hami.core.fragmentation`, after FGD, Weng et al., USENIX ATC'23): a node's
expected fragmentation is the free GPU capacity that the tasks of the learned task mix
could not use there, weighted by how common each task is, and a pod goes where placing
it grows that the least. The inputs come from what DRA mode has instead of the ledger:

* per card (a shareable device of our ResourceSlices; MIG-mode cards are left out),
  its free share in milli-GPU (1000 = the whole card) from its capacities and the sums
  of the ``consumedCapacity`` of the claims allocated on it: the scarcer of free
  ``memory`` and free ``cores`` (``1000 x free / capacity``, each), 0 when the card is
  tainted (unhealthy, cordoned) or all its ``shares`` are taken;
* per request (a claim's ``exactly`` request, or the shared-card entry of a prioritized
  list), its share of one card: the larger of ``memory`` over the card's memory and
  ``cores`` over 100 (x 1000, rounded up); a request without ``memory`` is the whole
  card. Extender mode's ledger measures compute only (a request without ``gpucores``
  counts as a whole card there): in DRA mode memory is what claims consume, so it counts.
* the pod's placement: its claims' requests (``status.resourceClaimStatuses``) as
  :meth:`hami.core.fragmentation.Placement.of` combines containers (GPU counts summed,
  the largest share); several GPUs count as whole cards, as in extender mode.

Node CPU/memory and GPU-type constraints are not part of the DRA measure (kube-scheduler
already filtered the nodes): every node counts as able to host every task class.
Pure, except :class:`DraTaskMix`, which keeps the arrivals it has seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hami.core.fragmentation import (
    UNLIMITED,
    WHOLE,
    FloatArray,
    IntArray,
    WorkloadDistribution,
    class_terms,
    frag_delta,
    fragment,
)
from hami.core.fragmentation.learn import Task
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra.fragstate import FragState
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB
from hami.dra.translate import SHARED_SUBREQUEST
from hami.dra.usage import MODE_DRA, dra_nodes

MAX_PRIORITY = 10


@dataclass(frozen=True, slots=True)
class Card:
    """One shareable card: its node, ``memory_mib`` capacity and ``free_milli`` (0-1000)."""

    node: str
    memory_mib: int
    free_milli: int


def cards(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
          ) -> list[Card]:
    """The shareable cards of our slices with their free share (module docstring), in
    node then index order; MIG-mode cards and cards without ``memory`` are left out."""
    out = []
    for node in dra_nodes(slices, claims):
        for d in node["devices"]:
            mem, cores, tasks = d["memory_mib"], d["cores"], d["tasks"]
            if d["mode"] != MODE_DRA or mem["total"] <= 0:
                continue
            free = WHOLE * max(mem["total"] - mem["used"], 0) // mem["total"]
            if cores["total"] > 0:
                free = min(free, WHOLE * max(cores["total"] - cores["used"], 0)
                           // cores["total"])
            if not d["health"] or d["cordoned"] or tasks["used"] >= max(tasks["total"], 1):
                free = 0
            out.append(Card(node["name"], mem["total"], free))
    return out


@dataclass(frozen=True, slots=True)
class Request:
    """One device request of a claim: ``count`` cards, ``memory_mib`` each (0: the whole
    card), ``cores_percent`` each."""

    count: int
    memory_mib: int
    cores_percent: int

    def milli(self, card_memory_mib: int) -> int:
        """The share (milli-GPU, 1..1000) of one card of ``card_memory_mib`` it takes."""
        if self.memory_mib <= 0 or card_memory_mib <= 0:
            return WHOLE
        by_memory = math.ceil(WHOLE * self.memory_mib / card_memory_mib)
        return max(1, min(WHOLE, max(by_memory, min(self.cores_percent, 100) * 10)))


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _q(raw: Any) -> int:
    try:
        return int(to_int_exact(quantity(raw)) or 0)
    except (QuantityError, ValueError, TypeError):
        return 0


def _exact(r: Mapping[str, Any]) -> Request | None:
    if r.get("allocationMode", "ExactCount") != "ExactCount":
        return None
    caps = _map(_map(r.get("capacity")).get("requests"))
    count = r.get("count", 1)
    count = count if isinstance(count, int) and count > 0 else 1
    return Request(count, _q(caps.get(MEMORY)) // MIB, _q(caps.get(CORES)))


def claim_requests(claim: Mapping[str, Any]) -> list[Request]:
    """The requests of a ResourceClaim's spec that hami's templates make: ``exactly``
    ones, and the shared-card entry of a prioritized list (a MIG entry is left out: its
    instance is not a share of a card). Malformed entries are left out."""
    spec = _map(claim.get("spec")) if isinstance(claim, Mapping) else {}
    reqs = _map(spec.get("devices")).get("requests")
    out = []
    for r in _list(reqs):
        if not isinstance(r, Mapping):
            continue
        exactly = r.get("exactly")
        if isinstance(exactly, Mapping) and exactly.get("deviceClassName") == DRIVER:
            req = _exact(exactly)
        else:
            shared = [s for s in _list(r.get("firstAvailable")) if isinstance(s, Mapping)
                      and s.get("name") == SHARED_SUBREQUEST]
            req = _exact(shared[0]) if shared else None
        if req is not None:
            out.append(req)
    return out


def pod_claim_keys(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(namespace, claim name)`` of the pod's claims (``status.resourceClaimStatuses``,
    where kube-controller-manager records the claims made from templates, and the
    ``resourceClaimName`` entries of the spec)."""
    meta, spec, status = (_map(pod.get(k)) for k in ("metadata", "spec", "status"))
    ns = str(meta.get("namespace") or "")
    names = [s.get("resourceClaimName") for s in _list(status.get("resourceClaimStatuses"))
             if isinstance(s, Mapping)]
    names += [c.get("resourceClaimName") for c in _list(spec.get("resourceClaims"))
              if isinstance(c, Mapping)]
    return [(ns, str(n)) for n in dict.fromkeys(names) if isinstance(n, str) and n]


def placement(requests: Sequence[Request], card_memory_mib: int) -> tuple[int, int]:
    """``(GPUs, share milli per GPU)`` of a pod's requests on cards of ``card_memory_mib``
    (GPU counts summed, the largest share), as extender mode's ``Placement.of``."""
    count = sum(r.count for r in requests)
    share = max((r.milli(card_memory_mib) for r in requests), default=0)
    return count, share


def task_of(requests: Sequence[Request], card_memory_mib: int) -> Task:
    """The learned-task tuple (GPUs, share milli, CPU 0, memory 0, any type)."""
    count, share = placement(requests, card_memory_mib)
    return count, share, 0, 0, ()


def node_deltas(all_cards: Sequence[Card], nodes: Sequence[str],
                dist: WorkloadDistribution, requests: Sequence[Request]) -> FloatArray:
    """Fragmentation growth (milli-GPU) per node of ``nodes`` if the pod of ``requests``
    is placed there; ``inf`` where no card of the node can take it (or no card at all).

    A one-card share is tried on each card with that share free (the node's best card
    counts; the share is computed against each card's own memory); several cards or a
    whole card use the node's fully free cards (:func:`hami.core.fragmentation.frag_delta`).
    """
    index = {n: i for i, n in enumerate(nodes)}
    sel = [c for c in all_cards if c.node in index]
    n = len(nodes)
    best = np.full(n, np.inf)
    if not sel or not requests:
        return best
    node_of: IntArray = np.array([index[c.node] for c in sel], dtype=np.int64)
    free: IntArray = np.array([c.free_milli for c in sel], dtype=np.int64)
    total, s, c = class_terms(free, node_of, n, dist)
    big: IntArray = np.full(n, UNLIMITED, dtype=np.int64)
    ok = np.ones((n, dist.size), dtype=np.bool_)
    before = fragment(total, s, c, big, big, ok, dist) @ dist.weight
    by_size: dict[int, list[int]] = {}
    for k, card in enumerate(sel):
        by_size.setdefault(card.memory_mib, []).append(k)
    for size, members in by_size.items():
        num_gpu, share = placement(requests, size)
        devs = np.array(members, dtype=np.int64)
        if num_gpu == 1 and share < WHOLE:
            devs = devs[free[devs] >= share]
            if devs.size == 0:
                continue
            rows = node_of[devs]
            d = frag_delta(total[rows], s[rows], c[rows], before[rows], big[rows], big[rows],
                           ok[rows], dist, request_milli=share, num_gpu=1, cpu_milli=0,
                           memory_mib=0, device_free=free[devs].astype(np.float64))
            np.minimum.at(best, rows, d)
            continue
        rows = np.unique(node_of[devs])
        whole_free = np.bincount(node_of[devs][free[devs] >= WHOLE], minlength=n)
        rows = rows[whole_free[rows] >= num_gpu]
        if rows.size:
            d = frag_delta(total[rows], s[rows], c[rows], before[rows], big[rows], big[rows],
                           ok[rows], dist, request_milli=WHOLE, num_gpu=num_gpu, cpu_milli=0,
                           memory_mib=0)
            np.minimum.at(best, rows, d)
    return best


def rank_scores(nodes: Sequence[str], deltas: FloatArray, free_milli: Mapping[str, int]
                ) -> list[dict[str, Any]]:
    """kube-scheduler's ``HostPriorityList`` from the growth per node: the extender's
    order (least growth first, ties to the node with less free GPU) as scores 10..0
    spread evenly over the distinct ``(growth, free)`` keys; ``inf`` scores 0."""
    keys = [(round(float(d), 6), free_milli.get(n, 0)) for n, d in zip(nodes, deltas,
                                                                       strict=True)]
    distinct = sorted({k for k in keys if math.isfinite(k[0])})
    rank = {k: i for i, k in enumerate(distinct)}
    span = max(len(distinct) - 1, 1)
    return [{"host": n, "score": 0 if k not in rank
             else round(MAX_PRIORITY * (1 - rank[k] / span))} for n, k in zip(nodes, keys,
                                                                              strict=True)]


class DraTaskMix:
    """The task mix learned online, as extender mode's ``LiveFragmentationOrder``: from
    the pods ``/prioritize`` is asked about (each pod once by UID, the last ``window``),
    relearned after ``relearn_every`` new arrivals, or each time the known tasks double
    while fewer than ``relearn_every`` arrivals are known; until then the allocated
    claims of other pods count too (``running``). Shares are against the largest card."""

    def __init__(self, relearn_every: int = 256, min_weight: float = 0.001,
                 window: int = 4096) -> None:
        self.relearn_every = relearn_every
        self.min_weight = min_weight
        self.window = window
        self._arrivals: dict[str, Task] = {}
        self._new = 0
        self._known_at_learn = 0
        self._running_at_learn = -1
        self.dist: WorkloadDistribution | None = None

    def note(self, uid: str, task: Task) -> None:
        """One pod asked about (a pod without GPUs or seen before is ignored)."""
        if task[0] <= 0 or not uid or uid in self._arrivals:
            return
        self._arrivals[uid] = task
        self._new += 1
        if len(self._arrivals) > self.window:
            del self._arrivals[next(iter(self._arrivals))]

    def current(self, running: Mapping[str, Task]) -> WorkloadDistribution | None:
        """The mix to score with (relearned when due); ``running``: pod UID -> task of
        the pods holding allocated claims. None when nothing is known yet."""
        warm = len(self._arrivals) >= self.relearn_every
        stale = (self.dist is None
                 or self._new >= min(self.relearn_every, max(self._known_at_learn, 1))
                 or (not warm and abs(len(running) - self._running_at_learn)
                     >= self.relearn_every))
        if stale:
            tasks = list(self._arrivals.values())
            if not warm:
                tasks += [t for uid, t in running.items()
                          if uid not in self._arrivals and t[0] > 0]
            if not tasks:
                return None
            self.dist = WorkloadDistribution.from_tasks(
                [t[0] for t in tasks], [t[1] for t in tasks], [t[2] for t in tasks],
                [t[3] for t in tasks], [t[4] for t in tasks], min_weight=self.min_weight)
            self._known_at_learn, self._running_at_learn = len(tasks), len(running)
            self._new = 0
        return self.dist


def _owner_uid(claim: Mapping[str, Any]) -> str:
    meta = _map(claim.get("metadata"))
    for ref in _list(meta.get("ownerReferences")):
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and ref.get("uid"):
            return str(ref["uid"])
    return f"claim:{meta.get('namespace')}/{meta.get('name')}"


def _allocated(claim: Mapping[str, Any]) -> bool:
    status = _map(claim.get("status"))
    alloc = _map(status.get("allocation"))
    return bool(_map(alloc.get("devices")).get("results"))


class DraFragmentation:
    """``fragmentation-aware`` scores for one scheduler (the learned mix lives here).

    Call with the pod of the ExtenderArgs, the candidate node names, the slices and
    claims (dicts) and ``version``: any value that changes whenever slices or claims
    change (the cards and the running tasks are recomputed only then; None: always).
    Returns the ``HostPriorityList``; every node scores 0 while the pod's claims are not
    known yet or nothing has been learned.
    """

    def __init__(self, mix: DraTaskMix | None = None) -> None:
        self.mix = mix or DraTaskMix()
        self._version: Any = object()
        self._cards: list[Card] = []
        self._running: dict[str, Task] = {}
        self._claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._ref_mib = 0
        self._state = FragState()

    def _refresh(self, slices: Iterable[Mapping[str, Any]],
                 claims: Iterable[Mapping[str, Any]], version: Any) -> None:
        """Per changed object (:class:`hami.dra.fragstate.FragState`): the same cards
        and running tasks as recomputing :func:`cards` and every pod's task."""
        if version is not None and version == self._version:
            return
        self._state.refresh(slices, claims)
        self._cards = self._state.cards()
        self._ref_mib = self._state.ref_mib
        self._claims = self._state.by_key
        self._running = self._state.running
        self._version = version

    def __call__(self, pod: Mapping[str, Any], nodes: Sequence[str],
                 slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
                 version: Any = None) -> list[dict[str, Any]]:
        """The scores (class docstring)."""
        self._refresh(slices, claims, version)
        reqs = [r for key in pod_claim_keys(pod) for r in claim_requests(self._claims.get(key, {}))]
        meta = _map(pod.get("metadata"))
        if reqs:
            self.mix.note(str(meta.get("uid") or ""), task_of(reqs, self._ref_mib))
        dist = self.mix.current(self._running)
        if not reqs or dist is None:
            return [{"host": n, "score": 0} for n in nodes]
        deltas = node_deltas(self._cards, nodes, dist, reqs)
        free: dict[str, int] = {}
        for c in self._cards:
            free[c.node] = free.get(c.node, 0) + c.free_milli
        return rank_scores(nodes, deltas, free)
