"""A one-step look-ahead over the task mix for the ``fragmentation-aware`` node order.

FGD (Weng et al., USENIX ATC'23, §4) is greedy: it places a task where the expected
fragmentation grows least now. Among the candidates whose growth is within
:attr:`LookAhead.tolerance_milli` of the best, :class:`LookAhead` also weighs what the
placement leaves for the *next* arrival, drawn from the same task mix (the scheduler
cannot see the future, so it uses the mix it knows or learned):

    score(n) = growth(task on n) + weight x sum_k p_k min(best_k(elsewhere), growth_k(n'))

where ``n'`` is node ``n`` after the placement, ``growth_k(n')`` the least growth of
fragmentation when a task of class ``k`` then goes to ``n'`` and ``best_k(elsewhere)``
the least growth it would cause on any other node (a class that fits nowhere counts
:data:`UNPLACEABLE_MILLI` per GPU it asks). This is a two-step greedy in expectation over
the next arrival's class: a node that is the only good home of a popular class loses
against an equally good node that is nobody's best home.

The per-node, per-class growth of the current cluster is cached and recomputed only for
nodes whose usage changed (usually one per decision). Everything is in milli-GPU.
"""

from __future__ import annotations

import numpy as np

from hami.core.fragmentation.measure import (
    WHOLE,
    BoolArray,
    FloatArray,
    IntArray,
    WorkloadDistribution,
    class_terms,
)
from hami.core.fragmentation.state import FragmentationState

#: What a class that fits on no node costs in the look-ahead, per GPU it asks (milli-GPU).
UNPLACEABLE_MILLI = float(WHOLE)
#: Nodes whose growth rows are computed in one batch (bounds the temporary arrays).
_CHUNK = 64


def _dedupe_columns(free: FloatArray) -> FloatArray:
    """``[R, G]`` free shares with repeated values in a row replaced by ``-1`` and the
    columns cut to the most distinct values of any row (growth depends on the value)."""
    ordered = -np.sort(-free, axis=1)
    dup = np.zeros_like(ordered, dtype=np.bool_)
    dup[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    ordered[dup] = -1.0
    ordered = -np.sort(-ordered, axis=1)
    width = max(int((ordered >= 0).sum(axis=1).max(initial=0)), 1)
    result: FloatArray = ordered[:, :width]
    return result


def class_growth(free: FloatArray, cpu_free: IntArray, mem_free: IntArray,
                 models_ok: BoolArray, dist: WorkloadDistribution) -> FloatArray:
    """``[R, K]``: for each row (a node, real or hypothetical) and each class ``k``, the
    least growth of the node's expected fragmentation when one task of class ``k`` is
    placed there (``inf`` where it cannot be placed).

    ``free`` is ``[R, G]``, the free share of each of the row's GPUs (``-1`` pads rows with
    fewer GPUs); ``cpu_free``/``mem_free`` are ``[R]``, ``models_ok`` ``[R, K]``. A GPU share
    goes to the GPU where it grows fragmentation least; whole GPUs take fully free ones.
    """
    rows, k = free.shape[0], dist.size
    out = np.full((rows, k), np.inf)
    if rows == 0:
        return out
    node_of = np.repeat(np.arange(rows), free.shape[1])
    flat = free.ravel()
    total, s, c = class_terms(np.where(flat < 0, 0, flat).astype(np.int64),
                              np.where(flat < 0, -1, node_of), rows, dist)
    free = _dedupe_columns(free)  # a share's growth depends only on its GPU's free share
    g = free.shape[1]
    need, num = dist.need(), dist.num_gpu
    w = dist.weight

    def frag(t: FloatArray, s2: FloatArray, c2: FloatArray, cpu: IntArray, mem: IntArray,
             ok: BoolArray) -> FloatArray:
        host = (ok & (cpu[..., None] >= dist.cpu_milli) & (mem[..., None] >= dist.memory_mib)
                & ((num == 0) | (c2 >= num)))
        result: FloatArray = np.where(host, s2, t[..., None]) @ w
        return result

    before = frag(total, s, c, cpu_free, mem_free, models_ok)
    fits = (models_ok & (cpu_free[:, None] >= dist.cpu_milli)
            & (mem_free[:, None] >= dist.memory_mib) & ((num == 0) | (c >= num)))
    share = (num == 1) & (need > 0) & (need < WHOLE)
    ks = np.flatnonzero(share)
    if ks.size:  # [R, G, Ks, K]: class m's share on GPU j of row r
        f = free[:, :, None, None]
        g2 = f - need[ks][None, None, :, None]
        nk = need[None, None, None, :]
        s2 = (s[:, None, None, :] - np.where(f < nk, np.maximum(f, 0), 0.0)
              + np.where(g2 < nk, g2, 0.0))
        c2 = c[:, None, None, :] - (f >= nk) + (g2 >= nk)
        t2 = np.broadcast_to((total[:, None] - need[ks][None, :])[:, None, :], (rows, g, ks.size))
        cpu = np.broadcast_to((cpu_free[:, None] - dist.cpu_milli[ks])[:, None, :], t2.shape)
        mem = np.broadcast_to((mem_free[:, None] - dist.memory_mib[ks])[:, None, :], t2.shape)
        after = frag(t2, s2, c2, cpu, mem, models_ok[:, None, None, :])
        grow = np.where(g2[..., 0] >= 0, after - before[:, None, None], np.inf)
        out[:, ks] = grow.min(axis=1)
    ko = np.flatnonzero(~share)
    if ko.size:  # [R, Ko, K]: whole GPUs (fully free ones) or no GPU
        used = np.where(num[ko] > 0, num[ko], 0)
        t2 = total[:, None] - WHOLE * used[None, :]
        c2 = c[:, None, :] - used[None, :, None] * (need[None, None, :] <= WHOLE)
        s2 = np.broadcast_to(s[:, None, :], c2.shape)
        cpu = cpu_free[:, None] - dist.cpu_milli[ko]
        mem = mem_free[:, None] - dist.memory_mib[ko]
        after = frag(t2, s2, c2, cpu, mem, models_ok[:, None, :])
        out[:, ko] = after - before[:, None]
    result: FloatArray = np.round(np.where(fits, out, np.inf), 6).astype(np.float64)
    return result


class LookAhead:
    """Re-ranks the best candidates of the fragmentation order by a one-step look-ahead
    over the task mix (see the module docstring for the score).

    ``tolerance_milli``: candidates whose growth is within this of the best are re-ranked
    (at most ``width`` of them, in the order given); ``weight``: how much the next
    arrival's expected growth counts against this task's own.
    """

    def __init__(self, tolerance_milli: float = 100.0, width: int = 16,
                 weight: float = 1.0, unplaceable_milli: float = UNPLACEABLE_MILLI) -> None:
        self.unplaceable_milli = unplaceable_milli
        self.tolerance_milli = tolerance_milli
        self.width = width
        self.weight = weight
        self._growth: FloatArray | None = None
        self._seen: IntArray | None = None
        self._state: FragmentationState | None = None

    def _free_rows(self, state: FragmentationState, nodes: IntArray) -> FloatArray:
        """``[R, G]`` free share per GPU of ``nodes`` (``-1`` pads), from the state."""
        assert state._free is not None
        counts = state._ptr[nodes + 1] - state._ptr[nodes]
        free = np.full((nodes.size, max(int(counts.max(initial=0)), 1)), -1.0)
        devs = state.devices_of(nodes)
        rows = np.repeat(np.arange(nodes.size), counts)
        cols = np.arange(devs.size) - np.repeat(np.cumsum(counts) - counts, counts)
        free[rows, cols] = state._free[devs]
        return free

    def _sync(self, state: FragmentationState) -> IntArray:
        """Reset the cache for a new state; the nodes whose cached growth is stale."""
        n = state.total.shape[0]
        if (self._growth is None or self._seen is None or self._state is not state
                or self._growth.shape != (n, state.dist.size)):
            self._growth = np.full((n, state.dist.size), np.inf)
            self._seen = np.full(n, -1, dtype=np.int64)
            self._state = state
        return np.flatnonzero(self._seen != state.node_version)

    def current(self, state: FragmentationState) -> FloatArray:
        """``[N, K]`` growth of each class on each node now (cached per node version)."""
        stale = self._sync(state)
        assert self._growth is not None and self._seen is not None
        for i in range(0, stale.size, _CHUNK):
            part = stale[i:i + _CHUNK]
            self._growth[part] = class_growth(
                self._free_rows(state, part), state.cpu_free[part], state.mem_free[part],
                state.models_ok[part], state.dist)
        self._seen[stale] = state.node_version[stale]
        return self._growth

    def rerank(self, state: FragmentationState, ordered: IntArray, deltas: FloatArray, *,
               request_milli: int, num_gpu: int, cpu_milli: int,
               memory_mib: int) -> IntArray:
        """``ordered`` (candidates, best first, with their growth ``deltas``) with its head
        re-ranked by the look-ahead score; the rest keeps its order."""
        if ordered.size < 2 or not np.isfinite(deltas[0]):
            return ordered
        head = np.flatnonzero(deltas <= deltas[0] + self.tolerance_milli)[: self.width]
        if head.size < 2:
            return ordered
        nodes = ordered[head]
        stale = self._sync(state)
        if stale.size > _CHUNK:
            self.current(state)
            stale = stale[:0]
        assert self._growth is not None and self._seen is not None
        # One batch: the stale nodes as they are, then the head's nodes after placing.
        placed = self._free_rows(state, nodes)
        _place(placed, request_milli, num_gpu)
        now_free = self._free_rows(state, stale)
        free = np.full((stale.size + nodes.size, max(placed.shape[1], now_free.shape[1])), -1.0)
        free[:stale.size, :now_free.shape[1]] = now_free
        free[stale.size:, :placed.shape[1]] = placed
        rows = np.concatenate([stale, nodes])
        taken = np.concatenate([np.zeros(stale.size, np.int64), np.ones(nodes.size, np.int64)])
        growth = class_growth(free, state.cpu_free[rows] - taken * cpu_milli,
                              state.mem_free[rows] - taken * memory_mib,
                              state.models_ok[rows], state.dist)
        self._growth[stale] = growth[:stale.size]
        self._seen[stale] = state.node_version[stale]
        after = growth[stale.size:]
        now = self._growth
        cols = np.arange(now.shape[1])
        first = np.argmin(now, axis=0)
        best = now[first, cols]
        masked = now.copy()
        masked[first, cols] = np.inf
        second = masked.min(axis=0)
        elsewhere = np.where(first[None, :] == nodes[:, None], second[None, :], best[None, :])
        future = np.minimum(elsewhere, after)
        dist = state.dist
        penalty = np.maximum(dist.num_gpu, 1) * self.unplaceable_milli
        future = np.where(np.isfinite(future), future, penalty[None, :])
        score = deltas[head] + self.weight * (future @ dist.weight)
        perm = np.lexsort((np.arange(head.size), np.round(score, 6)))
        result: IntArray = np.concatenate([nodes[perm], np.delete(ordered, head)])
        return result


def _place(free: FloatArray, request_milli: int, num_gpu: int) -> None:
    """Charge a request on each row of ``free`` (``[R, G]``, in place): a share takes the
    fullest GPU that fits (HAMi's binpack), whole GPUs fully free ones (lowest first)."""
    if num_gpu <= 0 or request_milli <= 0:
        return
    for r in range(free.shape[0]):
        fit = np.flatnonzero(free[r] >= request_milli)
        fit = fit[np.argsort(free[r, fit], kind="stable")][:num_gpu]
        free[r, fit] -= request_milli
