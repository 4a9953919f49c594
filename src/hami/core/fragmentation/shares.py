"""A request's fragmentation growth on every node at once (a GPU share's by free-share
regime), for a request shape the live order sees for the first time.

Taking ``r`` milli-GPU from a GPU with ``f`` free (``g = f - r`` left) changes, for task
class ``k`` needing ``need_k`` per GPU (:func:`~hami.core.fragmentation.measure.frag_delta`):

* ``f < need_k`` (too small before and after): ``S_k`` loses ``r``, ``C_k`` is unchanged;
* ``g < need_k <= f`` (usable before, not after): ``S_k`` gains ``g``, ``C_k`` loses one;
* ``need_k <= g`` (usable after too): neither changes.

So for each node the class's fragment after the share is one of three per-node values,
``X0`` (``S`` if the class still runs, else ``T - r``), ``XS`` (``S - r``, else
``T - r``) or ``XM + f`` (``S - r + f`` if it still runs with one GPU fewer, else
``T - r``), and which one depends on ``f`` alone. With ``Y`` the ``[4K, N]`` stack of
``X0``, ``XS``, ``XM`` and the 0/1 "runs with one GPU fewer", the expected fragmentation
after the share on a GPU of each distinct free share ``f_j`` is one product
``A @ Y`` (``A[j]`` holds the class weights in the slots of ``f_j``'s regimes): a
``[V, N]`` table for ``V`` distinct free shares, where the per-(node, share) rows of
:func:`~hami.core.fragmentation.measure.share_delta` need gathers row by row. The terms
are whole numbers; the weighted sums may differ from :func:`frag_delta`'s in the last
bit, which the growth's rounding to 6 decimals absorbs.
"""

from __future__ import annotations

import numpy as np

from hami.core.fragmentation.measure import (
    WHOLE,
    BoolArray,
    FloatArray,
    IntArray,
    WorkloadDistribution,
    Workspace,
)


def least_share_after(total: FloatArray, s: FloatArray, c: FloatArray, host: BoolArray,
                      dist: WorkloadDistribution, values: IntArray, lacks: BoolArray, *,
                      request_milli: int, work: Workspace | None = None) -> FloatArray:
    """Per node, the least expected fragmentation after placing a GPU share of
    ``request_milli`` (``0 < request_milli < 1000``) on one of its GPUs; ``inf`` for a
    node with none.

    ``total``/``s``/``c`` are the node terms (``[N]``, ``[N, K]``); ``host[n, k]``: class
    ``k`` accepts node ``n``'s GPU model and fits its CPU and memory after the request;
    ``values`` the ``V`` distinct free shares of the candidate GPUs (each
    ``>= request_milli``) and ``lacks[j, n]`` whether node ``n`` has no candidate GPU with
    ``values[j]`` free. The least growth of a node is this less its ``F_n``, rounded
    (subtracting and rounding keep the order). ``work`` holds the ``[*, N]``
    intermediates between calls.
    """
    k, n = dist.size, total.shape[0]
    if values.size == 0:
        return np.full(n, np.inf)
    r = float(request_milli)
    need = dist.need()
    weight = dist.weight
    f = values.astype(np.float64)
    small = f[:, None] < need[None, :]  # [V, K]
    usable_after = (f - r)[:, None] >= need[None, :]
    mid = ~small & ~usable_after
    a = np.zeros((values.size, 4 * k))
    np.copyto(a[:, :k], weight, where=usable_after)
    np.copyto(a[:, k:2 * k], weight, where=small)
    np.copyto(a[:, 2 * k:3 * k], weight, where=mid)
    np.copyto(a[:, 3 * k:], weight[None, :] * f[:, None], where=mid)
    y, after, terms, flags = (work or Workspace()).arrays(max(4 * k, values.size), n)
    y, after = y[:4 * k], after[:values.size]
    # Class-major [K, N] (a per-class value broadcast along long rows is fast).
    s_kn, c_kn = terms[:k], terms[k:2 * k]
    np.copyto(s_kn, s.T)
    np.copyto(c_kn, c.T)
    runs, runs_fewer = flags[:k], flags[k:2 * k]
    gpus = np.where(dist.num_gpu == 0, -np.inf, dist.num_gpu.astype(np.float64))[:, None]
    np.greater_equal(c_kn, gpus, out=runs)  # -inf: a class without GPUs needs none
    runs &= host.T
    np.greater_equal(c_kn, gpus + 1.0, out=runs_fewer)
    runs_fewer &= host.T
    np.copyto(y[:3 * k], (total - r)[None, :])
    np.copyto(y[:k], s_kn, where=runs)
    s_kn -= r
    np.copyto(y[k:2 * k], s_kn, where=runs)
    np.copyto(y[2 * k:3 * k], s_kn, where=runs_fewer)
    np.copyto(y[3 * k:], runs_fewer)
    np.matmul(a, y, out=after)  # [V, N]
    np.copyto(after, np.inf, where=lacks)
    least: FloatArray = after.min(axis=0)
    return least


def whole_after_all(total: FloatArray, s: FloatArray, c: FloatArray, host: BoolArray,
                    dist: WorkloadDistribution, *, request_milli: int, num_gpu: int,
                    work: Workspace | None = None) -> FloatArray:
    """Per node, the expected fragmentation after a request that is not a GPU share
    (:func:`frag_delta`'s other cases: ``num_gpu`` fully free GPUs become full, or no GPU
    when ``num_gpu`` or ``request_milli`` is 0), class-major over every node at once.
    ``host`` as for :func:`least_share_after`."""
    k, n = dist.size, total.shape[0]
    gpu_change = not (num_gpu == 0 or request_milli == 0)
    frag, terms, _, runs_all = (work or Workspace()).arrays(k, n)
    runs = runs_all[:k]
    np.copyto(terms, c.T)
    if gpu_change:
        terms -= (num_gpu * (dist.need() <= WHOLE))[:, None]
    gpus = np.where(dist.num_gpu == 0, -np.inf, dist.num_gpu.astype(np.float64))[:, None]
    np.greater_equal(terms, gpus, out=runs)  # -inf: a class without GPUs needs none
    runs &= host.T
    np.copyto(frag, (total - WHOLE * num_gpu if gpu_change else total)[None, :])
    np.copyto(frag, s.T, where=runs)
    after: FloatArray = dist.weight @ frag
    return after


class SlotTable:
    """Every node's GPUs as one padded ``[N, D]`` table of free shares (``D`` the most
    GPUs a node has; missing slots read 0, which no share fits), kept up to date node by
    node while it is :attr:`fresh`, refilled from the devices' free shares otherwise.

    Built from the device index of
    :class:`~hami.core.fragmentation.state.FragmentationState`: ``dev_order[ptr[i]:
    ptr[i + 1]]`` are node ``i``'s devices.
    """

    def __init__(self, dev_order: IntArray, ptr: IntArray) -> None:
        counts = np.diff(ptr)
        n = counts.size
        d = max(int(counts.max()) if n else 0, 1)
        node = np.repeat(np.arange(n), counts)
        #: Flat position in the table of each device of ``dev_order``.
        self.flat = node * d + (np.arange(dev_order.size) - ptr[:-1][node])
        self.dev_order = dev_order
        self.free = np.zeros((n, d), dtype=np.int64)
        #: The table holds the current free shares (else :meth:`fill` first).
        self.fresh = False
        #: Every free share lies in ``0..1000``.
        self.in_range = True
        self.value_of = np.empty((n, d), dtype=np.int64)
        self.node = np.arange(n)[:, None]
        self._gathered = np.empty(dev_order.size, dtype=np.int64)

    def fill(self, free_milli: IntArray) -> None:
        """Read every node's free shares from ``free_milli`` (per ledger device)."""
        np.take(free_milli, self.dev_order, out=self._gathered)
        self.free.ravel()[self.flat] = self._gathered
        self.in_range = bool(self._gathered.size == 0 or (
            self._gathered.min() >= 0 and self._gathered.max() <= WHOLE))
        self.fresh = True

    def set_node(self, node: int, free: list[int]) -> None:
        """Node ``node``'s GPUs now have ``free`` (in device index order)."""
        self.free[node, :len(free)] = free
        if free and (min(free) < 0 or max(free) > WHOLE):
            self.in_range = False


def least_share_after_all(table: SlotTable, free_milli: IntArray, total: FloatArray,
                          s: FloatArray, c: FloatArray, host: BoolArray,
                          dist: WorkloadDistribution, *, request_milli: int,
                          work: Workspace | None = None) -> FloatArray | None:
    """:func:`least_share_after` for every node, its GPUs' free shares from ``table``
    (refilled from ``free_milli`` unless fresh); None when a free share lies outside
    ``0..1000`` or there are more than 64 distinct ones: the caller then goes row by
    row."""
    if not table.fresh:
        table.fill(free_milli)
    if not table.in_range:
        return None
    free = table.free
    present = np.bincount(free.ravel(), minlength=WHOLE + 1)[request_milli:] > 0
    values = np.flatnonzero(present) + request_milli
    v = values.size
    if v > 64:
        return None
    n = free.shape[0]
    lookup = np.full(WHOLE + 1, v * n, dtype=np.int64)  # row v: no candidate
    lookup[values] = np.arange(v) * n
    cell = np.take(lookup, free, out=table.value_of)
    cell += table.node  # the (free share, node) cell of each GPU
    has = np.zeros((v + 1, n), dtype=np.bool_)
    has.ravel()[cell.ravel()] = True
    return least_share_after(total, s, c, host, dist, values, ~has[:v],
                             request_milli=request_milli, work=work)
