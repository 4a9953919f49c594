"""Node order ``fragmentation-aware`` with a fixed task mix: where a request grows the
expected fragmentation least (FGD, Weng et al., USENIX ATC'23, §4).

:class:`FragmentationScorer` is a node-order hook for the filter loop, signature
``(ctx: FilterContext, idx: IntArray) -> IntArray`` like ``hami.core.filter.NODE_ORDERS``
entries. Per request shape and node the growth is cached and recomputed only for nodes
whose usage changed.

Inside the chosen node, HAMi's ``binpack`` GPU order (the fullest card that fits) is
used: on the ``default`` trace, pinning instead the GPU the measure prefers changed no
placement outcome (the cards it picked differently were interchangeable).

Ties between nodes of equal growth go to the node with less free GPU (a packing
tie-break; then the candidate order). On openb ``default`` seed 42 it leaves 4.71 % of
GPUs unallocated at 100 % arrived demand where the candidate order alone left 5.15 %.
With ``look_ahead`` (opt-in: ``hami simulate --policies fragmentation-aware+lookahead``),
the near-best nodes of a GPU request are re-ranked by the expected growth of the next
arrival as well (:mod:`~hami.core.fragmentation.lookahead`), on the task mixes it suits;
it is off in the policy, its decision p99 not reliably within 2x binpack's
(docs/simulate.md).

A GPU request's growth gets a GPU-model pressure term
(:mod:`~hami.core.fragmentation.pressure`): where some classes accept only some GPU
models, the nodes of those models cost more to other tasks (none without constraints).
Every request's growth gets a CPU and memory stranding term
(:mod:`~hami.core.fragmentation.stranding`): free GPU that a node's free CPU or memory
cannot serve at the mix's ratio counts as lost, but when the mix holds multi-GPU classes
only among nodes that already hold GPU work (:mod:`~hami.core.fragmentation.wholeguard`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hami.core.fragmentation.lookahead import MAX_RERANKED, TOLERANCE_MILLI, LookAhead
from hami.core.fragmentation.measure import WHOLE, FloatArray, IntArray, WorkloadDistribution
from hami.core.fragmentation.pressure import MODEL_PRESSURE_WEIGHT, model_pressure
from hami.core.fragmentation.scalar import node_growth, share_growth
from hami.core.fragmentation.state import FEW_NODES, FragmentationState, node_types
from hami.core.fragmentation.stranding import STRANDING_WEIGHT, MixRatios, stranding_growth
from hami.core.fragmentation.wholeguard import guard_whole_nodes, mix_needs_whole_nodes
from hami.core.nodefit import BestFirst


@dataclass(frozen=True, slots=True)
class Placement:
    """The request shape the scorer ranks: per-GPU share, GPU count, CPU and memory."""

    request_milli: int
    num_gpu: int
    cpu_milli: int
    memory_mib: int

    @classmethod
    def of(cls, request: Any) -> Placement:
        """From a :class:`~hami.core.model.PodRequest` (GPU share = cores percent x 10,
        taken from its largest container; containers are summed for the GPU count)."""
        share, count = 0, 0
        for c in request.containers:
            if c is None or c.nums <= 0:
                continue
            count += c.nums
            share = max(share, min(c.cores_percent, 100) * 10 or WHOLE)
        return cls(share, count, request.cpu_milli, request.memory_mib)


class FragmentationScorer:
    """Node ordering for policy ``fragmentation-aware`` (FGD, paper §4).

    Call it as a filter node-order hook: ``scorer(ctx, idx)`` returns the candidate node
    indices ``idx`` ordered by the smallest growth of expected fragmentation that placing
    ``ctx.request`` there could cause (ties keep the input order). For a GPU-share request
    a node's value is the best over its GPUs that can take the share; the GPU policy of the
    same name then packs inside the node. :meth:`best_device` gives the device the
    fragmentation measure itself would pick.

    The workload distribution is fixed at construction (the simulator passes the trace's
    task mix; a live scheduler can rebuild the scorer from the running pods now and then).
    State is rebuilt when the ledger's node set changes and refreshed incrementally
    otherwise.
    """

    def __init__(self, dist: WorkloadDistribution, cache_size: int = 1024,
                 tie_break: str = "least-free-gpu", seed: int = 0,
                 look_ahead: bool | LookAhead = False,
                 model_pressure_weight: float = MODEL_PRESSURE_WEIGHT,
                 stranding_weight: float = STRANDING_WEIGHT,
                 whole_node_guard: bool | None = None) -> None:
        self.dist = dist
        #: Guard nodes with all GPUs free from the stranding term, ties to less free
        #: CPU (:mod:`~hami.core.fragmentation.wholeguard`): True, False, or None (the
        #: default) for "when the mix holds a multi-GPU class" (:meth:`guarded`).
        self.whole_node_guard = whole_node_guard
        self._guard_for: tuple[WorkloadDistribution, bool] | None = None
        self._capacity_for: tuple[IntArray, FloatArray] | None = None
        #: Weight of the CPU and memory stranding term (0: none).
        self.stranding_weight = stranding_weight
        self._ratios: tuple[WorkloadDistribution, MixRatios] | None = None
        #: Weight of the GPU-model pressure term (0: FGD's growth alone).
        self.model_pressure_weight = model_pressure_weight
        #: ``(state, mix, device index, pressure [N])``: recomputed when any changes.
        self._pressure: tuple[Any, Any, Any, FloatArray] | None = None
        #: With ``look_ahead`` (True, or a configured
        #: :class:`~hami.core.fragmentation.lookahead.LookAhead`), re-rank the near-best
        #: nodes of a GPU request by the next arrival's expected growth, on the mixes it
        #: suits. Off by default (docs/simulate.md).
        self.look_ahead = (look_ahead if isinstance(look_ahead, LookAhead)
                           else LookAhead() if look_ahead else None)
        self.tie_break = tie_break
        self._seed = seed
        #: Made on first use (same draws): importing numpy.random took 15 ms of the
        #: first live decision in bench/bench_filter.py.
        self._rng: np.random.Generator | None = None
        self.cache_size = cache_size
        self._state: FragmentationState | None = None
        self._ledger_id = -1
        self._version = -1
        self._cache: dict[Placement, tuple[FloatArray, IntArray]] = {}

    def set_distribution(self, dist: WorkloadDistribution) -> None:
        """Rank by a new task mix from now on. The per-node state is kept and its terms
        recomputed at the next decision (vectorised; the devices' free shares are not read
        again), which orders exactly as a new scorer for ``dist`` would."""
        self.dist = dist
        if self._state is not None:
            self._state.set_distribution(dist)
        self._cache.clear()
        if self.look_ahead is not None:
            self.look_ahead.reset()

    def state(self, ledger: Any) -> FragmentationState:
        """The refreshed per-node state for ``ledger``."""
        if (self._state is None or id(ledger) != self._ledger_id
                or ledger.version != self._version):
            self._state = FragmentationState(self.dist, node_types(ledger))
            self._ledger_id, self._version = id(ledger), ledger.version
            self._cache.clear()
            if self.look_ahead is not None:
                self.look_ahead.reset()
        self._state.refresh_from_ledger(ledger)
        return self._state

    def node_deltas(self, ledger: Any, placement: Placement, idx: IntArray) -> FloatArray:
        """Fragmentation growth per candidate node in ``idx`` (``inf`` if no GPU fits),
        milli-GPU, plus for a GPU request :attr:`model_pressure_weight` x the GPU milli
        asked x the node's :meth:`pressure`, plus for every request
        :attr:`stranding_weight` x the growth of the node's stranded GPU
        (:func:`~hami.core.fragmentation.stranding.stranding_growth`), for a GPU request
        guarded by :func:`~hami.core.fragmentation.wholeguard.guard_whole_nodes` when
        :meth:`guarded`.

        For a GPU share, a node's value is the best over its GPUs with at least the share
        free and a free slot. Values are cached per request shape and node, and
        recomputed only for nodes whose usage changed since (usually one per decision).
        """
        state = self.state(ledger)
        n = state.total.shape[0]
        entry = self._cache.get(placement)
        if entry is None:
            if len(self._cache) >= self.cache_size:
                self._cache.clear()
            entry = self._cache[placement] = (np.full(n, np.inf),
                                              np.full(n, -1, dtype=np.int64))
        best, seen = entry
        stale = idx[seen[idx] != state.node_version[idx]]
        if stale.size:
            seen[stale] = state.node_version[stale]
            if stale.size <= FEW_NODES:  # usually the one node the last pod went to
                best[stale] = [self._compute_one(state, placement, i) for i in stale.tolist()]
            else:
                best[stale] = self._compute(state, placement, stale)
        result: FloatArray = best[idx]
        if self.model_pressure_weight and placement.num_gpu:
            asked = placement.num_gpu * placement.request_milli
            pressure = self.pressure(state)
            if pressure.any():
                result = result + (self.model_pressure_weight * asked) * pressure[idx]
        if self.stranding_weight:
            held = self._ratios
            if held is None or held[0] is not state.dist:
                held = self._ratios = (state.dist, MixRatios.of(state.dist))
            grown = stranding_growth(
                state.total[idx], state.cpu_free[idx], state.mem_free[idx], held[1],
                gpu_milli=placement.num_gpu * placement.request_milli,
                cpu_milli=placement.cpu_milli, memory_mib=placement.memory_mib)
            term = self.stranding_weight * grown
            if placement.num_gpu and self.guarded():
                whole = state.total[idx] >= self._capacity(state)[idx]
                return guard_whole_nodes(result, term, whole)
            result = result + term
        return result

    def _capacity(self, state: FragmentationState) -> FloatArray:
        """``[N]`` each node's GPU capacity in milli-GPU (GPUs x 1000), kept while the
        state's grouping of devices by node is the same."""
        held = self._capacity_for
        if held is None or held[0] is not state._ptr:
            held = self._capacity_for = (state._ptr, np.diff(state._ptr) * float(WHOLE))
        return held[1]

    def guarded(self) -> bool:
        """Whether the whole-node guard applies: :attr:`whole_node_guard` when set, else
        whether the stranding term is on and the current mix holds a class asking for
        several GPUs
        (:func:`~hami.core.fragmentation.wholeguard.mix_needs_whole_nodes`)."""
        if self.whole_node_guard is not None:
            return self.whole_node_guard
        if not self.stranding_weight:
            return False
        if self._guard_for is None or self._guard_for[0] is not self.dist:
            self._guard_for = (self.dist, mix_needs_whole_nodes(self.dist))
        return self._guard_for[1]

    def pressure(self, state: FragmentationState) -> FloatArray:
        """``[N]`` :func:`~hami.core.fragmentation.pressure.model_pressure` of the
        state's nodes under its mix, kept until the state, its mix or its device index
        changes."""
        held = self._pressure
        if (held is not None and held[0] is state and held[1] is state.dist
                and held[2] is state._ptr):
            return held[3]
        gpus = np.diff(state._ptr)
        value = model_pressure(state.models_ok, gpus, state.dist)
        self._pressure = (state, state.dist, state._ptr, value)
        return value

    @staticmethod
    def _compute_one(state: FragmentationState, p: Placement, node: int) -> float:
        """:meth:`_compute` for one node, in plain Python."""
        row = state.row(node)
        if p.num_gpu == 1 and 0 < p.request_milli < WHOLE:
            return share_growth(row, state.classes, request_milli=p.request_milli,
                                cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)
        return node_growth(row, state.classes, request_milli=p.request_milli,
                           num_gpu=p.num_gpu, cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)

    def _compute(self, state: FragmentationState, p: Placement, nodes: IntArray) -> FloatArray:
        n = state.total.shape[0]
        if not (p.num_gpu == 1 and 0 < p.request_milli < WHOLE):
            if nodes.size >= n // 2:  # the whole cluster at once, class-major
                grown = state.delta_all(request_milli=p.request_milli, num_gpu=p.num_gpu,
                                        cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)
                result: FloatArray = grown[nodes]
                return result
            return state.delta_nodes(nodes, request_milli=p.request_milli,
                                     num_gpu=p.num_gpu, cpu_milli=p.cpu_milli,
                                     memory_mib=p.memory_mib)
        assert state._free is not None
        free, node_of = state._free, state.node_of
        if nodes.size < n // 2:
            devices = state.devices_of(nodes)
            devices = devices[free[devices] >= p.request_milli]
        else:
            every = state.least_share_all(request_milli=p.request_milli,
                                          cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)
            if every is not None:
                return every[nodes]
            devices = np.flatnonzero((node_of >= 0) & (free >= p.request_milli))
        best = np.full(n, np.inf)
        if devices.size:
            where, least = state.least_share_delta(devices, request_milli=p.request_milli,
                                                   cpu_milli=p.cpu_milli,
                                                   memory_mib=p.memory_mib)
            best[where] = least
        return best[nodes]

    def best_device(self, ledger: Any, placement: Placement, node: int) -> int | None:
        """For a GPU share on node ``node``: the ledger device index whose use grows
        fragmentation least (ties: lowest index), or None when none can take it."""
        state = self.state(ledger)
        assert state._free is not None
        devices = np.flatnonzero((state.node_of == node)
                                 & (state._free >= placement.request_milli))
        if devices.size == 0:
            return None
        deltas = state.delta_devices(devices, state.node_of, state._free,
                                     request_milli=placement.request_milli,
                                     cpu_milli=placement.cpu_milli,
                                     memory_mib=placement.memory_mib)
        return int(devices[int(np.argmin(deltas))])

    def __call__(self, ctx: Any, idx: IntArray) -> IntArray:
        """Filter hook: candidate nodes best (least fragmentation growth) first."""
        return self.order(ctx.ledger, Placement.of(ctx.request), idx)

    def best_first(self, ledger: Any, placement: Placement,
                   idx: IntArray) -> IntArray | BestFirst:
        """:meth:`order` that sorts only if the caller goes past its first node: the best
        node (least growth, then :attr:`tie_break`) is found in one pass and the whole
        order made on demand (``random`` and ``binpack`` ties, or the look-ahead, which
        re-ranks the near-best nodes: the order at once)."""
        if idx.size == 0 or self.tie_break not in ("stable", "least-free-gpu"):
            return self.order(ledger, placement, idx)
        look = (self.look_ahead is not None and self.tie_break == "least-free-gpu"
                and placement.num_gpu > 0 and idx.size > 1
                and self.look_ahead.suits(self.dist))
        deltas = self.node_deltas(ledger, placement, idx)
        least = deltas.min()
        if np.isnan(least):  # sorted last by order(); leave such cases to it
            return self.order(ledger, placement, idx)
        if look:
            return BestFirst(self._look_ahead_best(placement, idx, deltas, least),
                             lambda: self.order(ledger, placement, idx))
        ties = np.flatnonzero(deltas == least)
        if self.tie_break == "least-free-gpu" and ties.size > 1:
            assert self._state is not None
            if self.guarded():  # less free GPU, then less free CPU
                keys = (self._state.cpu_free[idx[ties]], self._state.total[idx[ties]])
                return BestFirst(int(idx[ties[np.lexsort(keys)[0]]]),
                                 lambda: self.order(ledger, placement, idx))
            ties = ties[np.argmin(self._state.total[idx[ties]]):]
        return BestFirst(int(idx[ties[0]]), lambda: self.order(ledger, placement, idx))

    def _look_ahead_best(self, p: Placement, idx: IntArray, deltas: FloatArray,
                         least: float) -> int:
        """The first node of :meth:`order` with the look-ahead, sorting only the nodes
        within its tolerance of the least growth ``least`` (the head it re-ranks)."""
        assert self._state is not None and self.look_ahead is not None
        near = np.flatnonzero(deltas <= least + TOLERANCE_MILLI)
        # By growth, then less free GPU (then less free CPU when guarded, as order()
        # does), then position: stable sorts from the last key to the first, as lexsort
        # orders (which took several times as long on 1,000 nodes).
        if self.guarded():
            near = near[np.argsort(self._state.cpu_free[idx[near]], kind="stable")]
        by_free = near[np.argsort(self._state.total[idx[near]], kind="stable")]
        near = by_free[np.argsort(deltas[by_free], kind="stable")][:MAX_RERANKED]
        head = self.look_ahead.rerank(
            self._state, idx[near], deltas[near], request_milli=p.request_milli,
            num_gpu=p.num_gpu, cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)
        return int(head[0])

    def order(self, ledger: Any, placement: Placement, idx: IntArray) -> IntArray:
        """``idx`` sorted by fragmentation growth, ties broken by :attr:`tie_break`:
        ``stable`` (input order), ``least-free-gpu`` (the default: the node with less
        free GPU first, then input order),
        ``binpack`` (HAMi's node score, most used first) or ``random`` (seeded)."""
        if idx.size == 0:
            return idx
        deltas = self.node_deltas(ledger, placement, idx)
        ordered: IntArray
        if self.tie_break == "random":
            if self._rng is None:
                self._rng = np.random.default_rng(self._seed)
            ordered = idx[np.lexsort((self._rng.random(idx.size), deltas))]
        elif self.tie_break == "binpack":
            used = ledger.node_scores()[idx]
            ordered = idx[np.lexsort((-used, deltas))]
        elif self.tie_break == "least-free-gpu":
            assert self._state is not None
            keys: list[Any] = [self._state.total[idx], deltas]
            if self.guarded():  # then less free CPU
                keys.insert(0, self._state.cpu_free[idx])
            order = np.lexsort(keys)  # lexsort is stable
            ordered = idx[order]
            if (self.look_ahead is not None and placement.num_gpu > 0 and idx.size > 1
                    and self.look_ahead.suits(self.dist)):
                ordered = self.look_ahead.rerank(
                    self._state, ordered, deltas[order], request_milli=placement.request_milli,
                    num_gpu=placement.num_gpu, cpu_milli=placement.cpu_milli,
                    memory_mib=placement.memory_mib)
        else:
            ordered = idx[np.argsort(deltas, kind="stable")]
        return ordered
