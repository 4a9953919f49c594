"""A GPU share's least fragmentation growth on every node at once, by free-share regime.

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
    BoolArray,
    FloatArray,
    IntArray,
    WorkloadDistribution,
)


def least_share_after(total: FloatArray, s: FloatArray, c: FloatArray, host: BoolArray,
                      dist: WorkloadDistribution, values: IntArray, lacks: BoolArray, *,
                      request_milli: int) -> FloatArray:
    """Per node, the least expected fragmentation after placing a GPU share of
    ``request_milli`` (``0 < request_milli < 1000``) on one of its GPUs; ``inf`` for a
    node with none.

    ``total``/``s``/``c`` are the node terms (``[N]``, ``[N, K]``); ``host[n, k]``: class
    ``k`` accepts node ``n``'s GPU model and fits its CPU and memory after the request;
    ``values`` the ``V`` distinct free shares of the candidate GPUs (each
    ``>= request_milli``) and ``lacks[j, n]`` whether node ``n`` has no candidate GPU with
    ``values[j]`` free. The least growth of a node is this less its ``F_n``, rounded
    (subtracting and rounding keep the order).
    """
    k = dist.size
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
    # Class-major [K, N] (a per-class value broadcast along long rows is fast).
    s_kn, c_kn = np.ascontiguousarray(s.T), np.ascontiguousarray(c.T)
    gpus = np.where(dist.num_gpu == 0, -np.inf, dist.num_gpu.astype(np.float64))[:, None]
    runs = c_kn >= gpus  # -inf: a class without GPUs needs none
    runs &= host.T
    runs_fewer = c_kn >= gpus + 1.0
    runs_fewer &= host.T
    y = np.empty((4 * k, total.shape[0]))
    np.copyto(y[:3 * k], (total - r)[None, :])
    np.copyto(y[:k], s_kn, where=runs)
    s_kn -= r
    np.copyto(y[k:2 * k], s_kn, where=runs)
    np.copyto(y[2 * k:3 * k], s_kn, where=runs_fewer)
    np.copyto(y[3 * k:], runs_fewer)
    after = a @ y  # [V, N]
    np.copyto(after, np.inf, where=lacks)
    least: FloatArray = after.min(axis=0)
    return least
