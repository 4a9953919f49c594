"""Node policy ``fragmentation-aware`` in DRA mode: scores for the ``prioritize`` verb.

The same scorer as extender mode's ``fragmentation-aware`` node order: one
:class:`hami.core.fragmentation.LiveFragmentationOrder` (FGD, Weng et al., USENIX
ATC'23, with hami's GPU-model pressure, CPU/memory stranding and whole-node guard, and
the task mix learned online the same way) reads DRA mode's cards and claims through
:class:`hami.dra.fragledger.DraLedger` instead of the extender's ledger. The DRA inputs:

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
* the pod's allowed GPU types: its ``nvidia.com/use-gputype`` (:func:`use_types`), which
  the learned mix keeps per task as extender mode's does (the model pressure term);
* the pod's placement: its claims' requests (``status.resourceClaimStatuses``) as
  :meth:`hami.core.fragmentation.Placement.of` combines containers (GPU counts summed,
  the largest share), against each candidate node's card size.

Node CPU and memory are not in DRA's objects: they come from the scheduler's Node and
Pod watches (:class:`hami.dra.hosts.HostUsage`), and the pod's own CPU and memory
requests from its spec, as extender mode's ledger has them; without a ``HostUsage``
they count as unchecked (the CPU/memory terms then add nothing). Pure, except the
learned mix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hami.api import names
from hami.core.fragmentation import (
    WHOLE,
    FloatArray,
    LiveFragmentationOrder,
    Placement,
)
from hami.core.fragmentation.learn import Task
from hami.core.model import csv_list
from hami.core.podobjects import list_or_empty, mapping_or_empty
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra.fragledger import DraLedger, Key
from hami.dra.hosts import HostUsage, pod_requests
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB
from hami.dra.translate import SHARED_SUBREQUEST

MAX_PRIORITY = 10


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


def _q(raw: Any) -> int:
    try:
        return int(to_int_exact(quantity(raw)) or 0)
    except (QuantityError, ValueError, TypeError):
        return 0


def _exact(r: Mapping[str, Any]) -> Request | None:
    if r.get("allocationMode", "ExactCount") != "ExactCount":
        return None
    caps = mapping_or_empty(mapping_or_empty(r.get("capacity")).get("requests"))
    count = r.get("count", 1)
    count = count if isinstance(count, int) and count > 0 else 1
    return Request(count, _q(caps.get(MEMORY)) // MIB, _q(caps.get(CORES)))


def claim_requests(claim: Mapping[str, Any]) -> list[Request]:
    """The requests of a ResourceClaim's spec that hami's templates make: ``exactly``
    ones, and the shared-card entry of a prioritized list (a MIG entry is left out: its
    instance is not a share of a card). Malformed entries are left out."""
    spec = mapping_or_empty(claim.get("spec")) if isinstance(claim, Mapping) else {}
    reqs = mapping_or_empty(spec.get("devices")).get("requests")
    out = []
    for r in list_or_empty(reqs):
        if not isinstance(r, Mapping):
            continue
        exactly = r.get("exactly")
        if isinstance(exactly, Mapping) and exactly.get("deviceClassName") == DRIVER:
            req = _exact(exactly)
        else:
            shared = [s for s in list_or_empty(r.get("firstAvailable")) if isinstance(s, Mapping)
                      and s.get("name") == SHARED_SUBREQUEST]
            req = _exact(shared[0]) if shared else None
        if req is not None:
            out.append(req)
    return out


def pod_claim_keys(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(namespace, claim name)`` of the pod's claims (``status.resourceClaimStatuses``,
    where kube-controller-manager records the claims made from templates, and the
    ``resourceClaimName`` entries of the spec)."""
    meta, spec, status = (mapping_or_empty(pod.get(k)) for k in ("metadata", "spec", "status"))
    ns = str(meta.get("namespace") or "")
    names = [s.get("resourceClaimName") for s in list_or_empty(status.get("resourceClaimStatuses"))
             if isinstance(s, Mapping)]
    names += [c.get("resourceClaimName") for c in list_or_empty(spec.get("resourceClaims"))
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


#: At most this many ``nvidia.com/use-gputype`` entries of a pod count for the mix.
MAX_USE_TYPES = 32


def use_types(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The pod's ``nvidia.com/use-gputype`` (lower case, as extender mode's learned mix
    reads it; the webhook turns it into the claims' selectors and leaves the annotation),
    at most :data:`MAX_USE_TYPES` entries; ``()`` when absent or malformed."""
    annotations = mapping_or_empty(mapping_or_empty(pod.get("metadata")).get("annotations"))
    raw = annotations.get(names.USE_GPUTYPE)
    return csv_list(raw, lower=True)[:MAX_USE_TYPES] if isinstance(raw, str) else ()


def rank_scores(keys: Sequence[tuple[float, ...]]) -> list[int]:
    """kube-scheduler priorities 10..0 for nodes in the scorer's order (best first)
    whose sort keys are ``keys`` (the first item the growth): spread evenly over the
    distinct keys, equal keys equal scores, an infinite growth (the request fits no card
    there) 0. Returns the scores in the same order."""
    distinct: list[tuple[float, ...]] = []
    for k in keys:
        if math.isfinite(k[0]) and (not distinct or distinct[-1] != k):
            distinct.append(k)
    span = max(len(distinct) - 1, 1)
    rank = {k: i for i, k in enumerate(distinct)}
    return [0 if k not in rank else round(MAX_PRIORITY * (1 - rank[k] / span))
            for k in keys]


class DraFragmentation:
    """``fragmentation-aware`` scores for one scheduler: the extender's scorer and
    learned mix (``order``, a :class:`~hami.core.fragmentation.LiveFragmentationOrder`)
    over DRA mode's objects (a :class:`~hami.dra.fragledger.DraLedger`).

    Call with the pod of the ExtenderArgs, the candidate node names, the slices and
    claims (dicts by ``(namespace, name)`` as the watch cache keeps them, or lists) and
    ``version``: any value that changes whenever slices or claims change (None: always
    compared). Only the claims that are not the objects seen before are read again, and
    only the nodes they are on are scored again. Returns the ``HostPriorityList`` in the
    order of the names: the scorer's order (least growth of expected fragmentation,
    ties to less free GPU) as scores 10..0 (:func:`rank_scores`); every node scores 0
    while the pod's claims are not known yet or nothing has been learned, a node
    without our cards or where no card fits 0.
    """

    def __init__(self, order: LiveFragmentationOrder | None = None,
                 hosts: HostUsage | None = None) -> None:
        self.order = order or LiveFragmentationOrder()
        self.hosts = hosts
        self.ledger = DraLedger(claim_requests, task_of)
        self._version: Any = object()
        self._hosts_seq = -1

    def __call__(self, pod: Mapping[str, Any], nodes: Sequence[str],
                 slices: Mapping[Key, Any] | Iterable[Mapping[str, Any]],
                 claims: Mapping[Key, Any] | Iterable[Mapping[str, Any]],
                 version: Any = None) -> list[dict[str, Any]]:
        """The scores (class docstring)."""
        led, hosts = self.ledger, self.hosts
        if hosts is not None:
            hosts.refresh()
        if (version is None or version != self._version
                or (hosts is not None and hosts.seq != self._hosts_seq)):
            led.sync(slices, claims, hosts)
            self._version = version
            self._hosts_seq = -1 if hosts is None else hosts.seq
        reqs = [r for key in pod_claim_keys(pod) for r in claim_requests(led.claim(key) or {})]
        zero = [{"host": n, "score": 0} for n in nodes]
        if not reqs:
            return zero
        uid = str(mapping_or_empty(pod.get("metadata")).get("uid") or "")
        cpu, mem = pod_requests(pod)
        count, share = placement(reqs, led.ref_mib)
        scorer = self.order.scorer_for(led, uid, Placement(share, count, cpu, mem),
                                       use_types(pod))
        idx = led.indices(nodes)
        known = np.flatnonzero(idx >= 0)
        if scorer is None or known.size == 0:
            return zero
        cand = idx[known]
        deltas: FloatArray = np.full(cand.size, np.inf)
        sizes = led.node_card_mib[cand]
        for size in np.unique(sizes).tolist():  # one placement per card size
            if size <= 0:
                continue
            sel = np.flatnonzero(sizes == size)
            count, share = placement(reqs, size)
            deltas[sel] = scorer.node_deltas(led, Placement(share, count, cpu, mem), cand[sel])
        state = scorer.state(led)
        sort_keys: list[Any] = [state.total[cand], deltas]
        if count and scorer.guarded():  # as FragmentationScorer.order: then less free CPU
            sort_keys.insert(0, state.cpu_free[cand])
        order = np.lexsort(sort_keys)
        columns = [np.round(k[order], 6).tolist() for k in reversed(sort_keys)]
        ranked = rank_scores(list(zip(*columns, strict=True)))
        out = zero
        for pos, score in zip(known[order].tolist(), ranked, strict=True):
            out[pos] = {"host": nodes[pos], "score": score}
        return out
