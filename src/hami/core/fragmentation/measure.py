"""The fragmentation measure and its growth under a placement (FGD, paper §3-§4).

Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC'23, §3 (fragmentation measure) and §4 (the
FGD heuristic). Written from the paper's definitions, not from its code.

The measure (paper §3.2): for a task ``m`` and a node ``n``, the *fragment* ``F_n(m)`` is
the node's unallocated GPU capacity that ``m`` cannot use:

* if ``m`` cannot run on ``n`` at all (too few GPUs with enough free share, not enough CPU
  or memory, or a GPU model ``m`` does not accept), **all** free GPU of ``n`` is
  fragmented for it;
* otherwise, the free capacity of every GPU whose free share is smaller than what ``m``
  needs per GPU (``gpu_milli``; 1000 for whole-GPU tasks) is fragmented; a task that asks
  for no GPU fragments nothing on a node where it fits.

The expected fragmentation of a node under a workload (paper §3.3, eq. 2) weights
``F_n(m)`` by the popularity ``p_m`` of each task class of the target workload:
``F_n = sum_m p_m F_n(m)``. The cluster's fragmentation is the sum over nodes.

FGD (paper §4) places each task where the expected fragmentation grows the least:
``delta = F_n(after) - F_n(before)``. Everything here is in milli-GPU (1000 = one GPU)
and works on flat numpy arrays, so a decision costs a few vector operations over the
candidate devices and the ``K`` task classes. These are pure functions over explicit
arrays, easy to test on hand-made clusters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: One whole GPU in milli-GPU.
WHOLE = 1000


@dataclass(frozen=True)
class WorkloadDistribution:
    """The target workload as ``K`` task classes with popularity weights.

    Arrays have length ``K``. ``gpu_milli`` is the share needed on *each* of ``num_gpu``
    GPUs (1000 for whole-GPU tasks, 0 for CPU-only ones); ``models`` lists, per class, the
    accepted GPU models (``()`` = any), matched case-insensitively as substrings of the
    node's GPU type like ``nvidia.com/use-gputype``. ``weight`` sums to 1.
    """

    num_gpu: IntArray
    gpu_milli: IntArray
    cpu_milli: IntArray
    memory_mib: IntArray
    weight: FloatArray
    models: tuple[tuple[str, ...], ...]

    @property
    def size(self) -> int:
        """Number of task classes ``K``."""
        return int(self.num_gpu.shape[0])

    @classmethod
    def from_tasks(cls, num_gpu: Sequence[int], gpu_milli: Sequence[int],
                   cpu_milli: Sequence[int], memory_mib: Sequence[int],
                   models: Sequence[Sequence[str]] | None = None,
                   min_weight: float = 0.0,
                   by_resources: bool = False) -> WorkloadDistribution:
        """Group tasks into classes by ``(num_gpu, gpu_milli, models)``.

        With ``by_resources`` the task's CPU and memory are part of the class too (more
        classes, exact CPU/memory); otherwise a class's CPU and memory are the medians of
        its tasks (so that "does the task fit the node's CPU" is judged on a typical
        member). Classes lighter than ``min_weight`` are dropped and the rest
        renormalised.

        Raises:
            ValueError: no tasks, or sequences of different lengths.
        """
        n = len(num_gpu)
        if n == 0:
            raise ValueError("a workload distribution needs at least one task")
        if not (len(gpu_milli) == len(cpu_milli) == len(memory_mib) == n):
            raise ValueError("task attribute sequences differ in length")
        gpus = np.asarray(num_gpu, dtype=np.int64)
        share = np.where(gpus > 0, np.asarray(gpu_milli, dtype=np.int64), 0)
        cpu = np.asarray(cpu_milli, dtype=np.int64)
        mem = np.asarray(memory_mib, dtype=np.int64)
        model_rank, accepted = _model_ranks(models, n)
        res = (cpu, mem) if by_resources else (np.zeros(n, np.int64),) * 2
        # Classes by (num_gpu, share, models[, cpu, memory]), then heaviest first, ties in
        # that key's order; vectorised, as a relearn reads up to thousands of tasks.
        order = np.lexsort((res[1], res[0], model_rank, share, gpus))
        cols = [x[order] for x in (gpus, share, model_rank, *res)]
        first = np.zeros(n, dtype=np.bool_)
        first[0] = True
        for col in cols:
            first[1:] |= col[1:] != col[:-1]
        starts = np.flatnonzero(first)
        counts = np.diff(np.r_[starts, n])
        ranked = np.argsort(-counts, kind="stable")
        keep = ranked[counts[ranked] / n >= min_weight]
        keep = keep if keep.size else ranked[:1]
        group = np.cumsum(first) - 1  # per task in ``order``: its class
        by_cpu = order[np.lexsort((cpu[order], group))]
        by_mem = order[np.lexsort((mem[order], group))]
        lo = starts[keep] + (counts[keep] - 1) // 2
        hi = starts[keep] + counts[keep] // 2
        weight = counts[keep].astype(np.float64)
        return cls(
            num_gpu=cols[0][starts[keep]],
            gpu_milli=cols[1][starts[keep]],
            cpu_milli=_middle(cpu[by_cpu[lo]], cpu[by_cpu[hi]]),
            memory_mib=_middle(mem[by_mem[lo]], mem[by_mem[hi]]),
            weight=weight / weight.sum(),
            models=tuple(accepted[r] for r in cols[2][starts[keep]].tolist()),
        )

    def __post_init__(self) -> None:
        need = np.where(self.num_gpu > 0, self.gpu_milli, 0).astype(np.float64)
        object.__setattr__(self, "_need", need)

    def need(self) -> FloatArray:
        """Per class, the free share a GPU needs to be usable by it (0 for CPU-only)."""
        result: FloatArray = self._need  # type: ignore[attr-defined]
        return result


def _model_ranks(models: Sequence[Sequence[str]] | None,
                 n: int) -> tuple[IntArray, list[tuple[str, ...]]]:
    """Per task, the rank of its accepted models (lower-cased, sorted) among the distinct
    ones in tuple order, and those tuples by rank."""
    if models is None:
        return np.zeros(n, dtype=np.int64), [()]
    raw = dict.fromkeys(tuple(m) for m in models)
    accepted = sorted({tuple(sorted(x.lower() for x in m)) for m in raw})
    rank_of = {m: accepted.index(tuple(sorted(x.lower() for x in m))) for m in raw}
    ranks = np.fromiter((rank_of[tuple(m)] for m in models), dtype=np.int64, count=n)
    return ranks, accepted


def _middle(low: IntArray, high: IntArray) -> IntArray:
    """``int(np.median(...))`` from the two middle values (equal for an odd count)."""
    result: IntArray = ((low.astype(np.float64) + high) / 2.0).astype(np.int64)
    return result


def model_mask(node_types: Sequence[str], dist: WorkloadDistribution) -> BoolArray:
    """``[N, K]``: node ``n``'s GPU type is accepted by class ``k`` (substring match)."""
    kinds = {t: i for i, t in enumerate(dict.fromkeys(node_types))}  # few: match each once
    of_kind = np.fromiter((kinds[t] for t in node_types), dtype=np.int64,
                          count=len(node_types))
    per_kind = np.ones((len(kinds), dist.size), dtype=np.bool_)
    for k, allowed in enumerate(dist.models):
        if allowed:
            per_kind[:, k] = [any(a in t.lower() for a in allowed) for t in kinds]
    out: BoolArray = per_kind[of_kind]
    return out


def class_terms(free_milli: IntArray, node_of: IntArray, n_nodes: int,
                dist: WorkloadDistribution) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per-node sufficient statistics of the fragment measure.

    Returns ``(T, S, C)``: ``T[n]`` total free GPU of node ``n``; ``S[n, k]`` free GPU on
    GPUs too small for class ``k`` (``free < need_k``); ``C[n, k]`` how many GPUs have at
    least ``need_k`` free. Devices with ``node_of < 0`` are ignored.
    """
    valid = node_of >= 0
    if n_nodes > 1:
        values, of_value = distinct_shares(free_milli[valid])
        if values.size <= _FEW_VALUES:
            return _class_terms_by_value(values, of_value, node_of[valid], n_nodes, dist)
    free = free_milli[valid].astype(np.float64)
    nodes = node_of[valid]
    small = free[:, None] < dist.need()[None, :]
    frag_part = np.where(small, free[:, None], 0.0)
    usable = (~small).astype(np.float64)
    if n_nodes == 1:
        return (np.array([free.sum()]), frag_part.sum(axis=0, keepdims=True),
                usable.sum(axis=0, keepdims=True))
    total: FloatArray = np.bincount(nodes, weights=free, minlength=n_nodes)[:n_nodes].astype(
        np.float64)
    # One bincount over (node, class) cells; the sums are of whole numbers, so exact.
    k = dist.size
    cell = (nodes[:, None] * k + np.arange(k)[None, :]).ravel()
    s = np.bincount(cell, weights=frag_part.ravel(), minlength=n_nodes * k)[:n_nodes * k]
    c = np.bincount(cell, weights=usable.ravel(), minlength=n_nodes * k)[:n_nodes * k]
    return (total, np.asarray(s, dtype=np.float64).reshape(n_nodes, k),
            np.asarray(c, dtype=np.float64).reshape(n_nodes, k))


#: At most this many distinct free shares: :func:`class_terms` goes by free share.
_FEW_VALUES = 64


def distinct_shares(free_milli: IntArray) -> tuple[IntArray, IntArray]:
    """``(values, of_value)``: the distinct free shares ascending, and each device's
    position among them (``values[of_value] == free_milli``)."""
    free = np.asarray(free_milli, dtype=np.int64)
    if free.size and free.min() >= 0 and free.max() <= WHOLE:  # the usual range: no sort
        present = np.bincount(free, minlength=WHOLE + 1) > 0
        values: IntArray = np.flatnonzero(present)
        of_value: IntArray = (np.cumsum(present) - 1)[free]
        return values, of_value
    values, of_value = np.unique(free, return_inverse=True)
    return values, of_value.reshape(-1)


def _class_terms_by_value(values: IntArray, of_value: IntArray, nodes: IntArray,
                          n_nodes: int, dist: WorkloadDistribution
                          ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """:func:`class_terms` through a ``[N, V]`` count of each node's devices per distinct
    free share: ``S = counts @ (value if small)``, ``C = counts @ (not small)``. Whole
    numbers throughout, so exactly the sums device by device."""
    v = values.size
    counts = np.bincount(nodes * v + of_value, minlength=n_nodes * v)[:n_nodes * v]
    counts_f = counts.reshape(n_nodes, v).astype(np.float64)
    free = values.astype(np.float64)
    small = free[:, None] < dist.need()[None, :]
    total: FloatArray = counts_f @ free
    s: FloatArray = counts_f @ np.where(small, free[:, None], 0.0)
    c: FloatArray = counts_f @ (~small).astype(np.float64)
    return total, s, c


def fragment(total: FloatArray, s: FloatArray, c: FloatArray, cpu_free: IntArray,
             mem_free: IntArray, models_ok: BoolArray,
             dist: WorkloadDistribution) -> FloatArray:
    """``F_n(k)`` for every row and class: ``S`` where class ``k`` can run, else ``T``.

    Rows are nodes (or hypothetical node states); ``total`` is ``[R]``, ``s``/``c``/
    ``models_ok`` are ``[R, K]``, ``cpu_free``/``mem_free`` ``[R]``.
    """
    host = (models_ok & (cpu_free[:, None] >= dist.cpu_milli[None, :])
            & (mem_free[:, None] >= dist.memory_mib[None, :])
            & ((dist.num_gpu[None, :] == 0) | (c >= dist.num_gpu[None, :])))
    return np.where(host, s, total[:, None])


def node_fragmentation(free_milli: IntArray, node_of: IntArray, cpu_free: IntArray,
                       mem_free: IntArray, models_ok: BoolArray,
                       dist: WorkloadDistribution) -> FloatArray:
    """Expected fragmentation ``F_n = sum_k p_k F_n(k)`` of every node, in milli-GPU.

    ``free_milli``/``node_of`` are per device; ``cpu_free``/``mem_free``/``models_ok``
    per node (``models_ok`` is ``[N, K]``, see :func:`model_mask`). A negative
    ``cpu_free`` means the node is already over-committed; nothing fits there.
    """
    n = cpu_free.shape[0]
    total, s, c = class_terms(free_milli, node_of, n, dist)
    result: FloatArray = fragment(total, s, c, cpu_free, mem_free, models_ok, dist) @ dist.weight
    return result


def frag_delta(total: FloatArray, s: FloatArray, c: FloatArray, before: FloatArray,
               cpu_free: IntArray, mem_free: IntArray, models_ok: BoolArray,
               dist: WorkloadDistribution, *, request_milli: int, num_gpu: int,
               cpu_milli: int, memory_mib: int,
               device_free: FloatArray | None = None) -> FloatArray:
    """Growth of expected fragmentation if the request is placed on each candidate.

    Candidates are rows: node statistics gathered per candidate (``total``, ``s``, ``c``,
    ``before`` = current ``F_n``, ``cpu_free``, ``mem_free``, ``models_ok``).

    * a GPU share (``num_gpu == 1`` and ``request_milli < 1000``): one row per candidate
      *device*, whose current free share is ``device_free``; the device loses
      ``request_milli``;
    * whole GPUs (``request_milli == 1000``): one row per node; ``num_gpu`` fully free
      GPUs become full (they were not in any ``S``, and leave every ``C``);
    * no GPU: one row per node; only CPU and memory change.

    Returns ``F_n(after) - F_n(before)`` per row (paper §4, the "fragmentation gradient").
    """
    need = dist.need()[None, :]
    if num_gpu == 0 or request_milli == 0:
        t2, s2, c2 = total, s, c
    elif num_gpu == 1 and request_milli < WHOLE:
        if device_free is None:
            raise ValueError("a GPU-share request needs device_free per candidate")
        f = device_free[:, None]
        g = f - request_milli
        t2 = total - request_milli
        s2 = s - np.where(f < need, f, 0.0) + np.where(g < need, g, 0.0)
        c2 = c - (f >= need) + (g >= need)
    else:
        t2 = total - WHOLE * num_gpu
        s2 = s
        c2 = c - num_gpu * (need <= WHOLE)
    after = fragment(t2, s2, c2, cpu_free - cpu_milli, mem_free - memory_mib, models_ok,
                     dist) @ dist.weight
    # Rounded so that equal placements tie exactly whatever the batch shape of the sums.
    result: FloatArray = np.round(after - before, 6)
    return result


def share_delta(total: FloatArray, s: FloatArray, c: FloatArray, before: FloatArray,
                host: BoolArray, dist: WorkloadDistribution, node_of_row: IntArray,
                device_free: IntArray, *, request_milli: int,
                work: Workspace | None = None,
                shares: tuple[IntArray, IntArray] | None = None) -> FloatArray:
    """:func:`frag_delta` of a GPU share, one row per candidate device, computed faster.

    ``total``/``s``/``c``/``before`` are per node (``[N]``, ``[N, K]``); ``host[n, k]``:
    class ``k`` accepts node ``n``'s GPU model and fits its CPU and memory after the
    request; row ``i`` is a device of node ``node_of_row[i]`` with ``device_free[i]``
    (``>= request_milli``) free. Same values as :func:`frag_delta` (the terms are whole
    numbers, exact in float64); see :func:`share_after` for ``work`` and ``shares``.
    """
    after = share_after(total, s, c, host, dist, node_of_row, device_free,
                        request_milli=request_milli, work=work, shares=shares)
    result: FloatArray = np.round(after - before[node_of_row], 6)
    return result


def share_after(total: FloatArray, s: FloatArray, c: FloatArray, host: BoolArray,
                dist: WorkloadDistribution, node_of_row: IntArray, device_free: IntArray, *,
                request_milli: int, work: Workspace | None = None,
                shares: tuple[IntArray, IntArray] | None = None) -> FloatArray:
    """The expected fragmentation ``F_n`` after the GPU share, one value per row of
    :func:`share_delta` (which subtracts ``F_n`` before and rounds).

    The change of ``S`` and ``C`` that taking the share from a device causes depends on
    the device's free share alone, so it is computed once per distinct free share and
    added to the node's terms. ``shares``, when the caller has it, is
    :func:`distinct_shares` of ``device_free``. ``work`` (reused between calls) holds the
    intermediates, class-major (``[K, R]``: numpy broadcasts a per-row value along long
    contiguous rows fast, along ``K`` short ones slowly); fresh large arrays cost page
    faults.
    """
    k = dist.size
    need = dist.need()[:, None]
    values, row_value = distinct_shares(device_free) if shares is None else shares
    f = values.astype(np.float64)[None, :]
    g = f - request_milli
    change = np.empty((2 * k, values.size))  # [K, V] change of S, then of C
    np.subtract(np.where(g < need, g, 0.0), np.where(f < need, f, 0.0), out=change[:k])
    np.subtract(g >= need, (f >= need).astype(np.float64), out=change[k:])
    rows = node_of_row.shape[0]
    terms, tmp, _, ok = (work or Workspace()).arrays(2 * k, rows)
    np.take(np.concatenate((s.T, c.T)), node_of_row, axis=1, out=terms, mode="clip")
    terms += np.take(change, row_value, axis=1, out=tmp, mode="clip")
    s2, c2, frag = terms[:k], terms[k:], tmp[:k]
    # The class still has its GPUs (-inf: it needs none), and its model, CPU and memory.
    gpus = np.where(dist.num_gpu == 0, -np.inf, dist.num_gpu.astype(np.float64))
    host_ok = ok[:k]
    np.greater_equal(c2, gpus[:, None], out=host_ok)
    host_ok &= np.take(host.T, node_of_row, axis=1, mode="clip")
    np.copyto(frag, (total[node_of_row] - request_milli)[None, :])
    np.copyto(frag, s2, where=host_ok)  # F_n(k) after: S where the class still runs, else T
    after: FloatArray = dist.weight @ frag
    return after


class Workspace:
    """Reusable 2-D arrays (three float, one bool) for :func:`share_after` and the
    whole-cluster computations of :mod:`~hami.core.fragmentation.shares`.

    One flat buffer per kind, grown to twice what is asked, so that a new request shape
    or a relearned mix with more classes usually finds it large enough."""

    def __init__(self) -> None:
        self._f = np.zeros(0)
        self._b = np.zeros(0, dtype=np.bool_)

    def arrays(self, rows: int, k: int
               ) -> tuple[FloatArray, FloatArray, FloatArray, BoolArray]:
        """Three float and one bool C-contiguous ``[rows, k]`` arrays, contents undefined
        (callers ask class-major: ``[2K, R]`` rows, ``[*, N]`` nodes)."""
        size = rows * k
        if self._b.size < size:
            self._f = np.empty(6 * size)
            self._b = np.empty(2 * size, dtype=np.bool_)
        f = self._f
        return (f[:size].reshape(rows, k), f[size:2 * size].reshape(rows, k),
                f[2 * size:3 * size].reshape(rows, k), self._b[:size].reshape(rows, k))
