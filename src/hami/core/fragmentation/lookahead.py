"""A one-arrival look-ahead for the ``fragmentation-aware`` node order.

FGD (Weng et al., USENIX ATC'23, §4) places a task where the expected fragmentation grows
least. Among the candidate nodes whose growth is within :data:`TOLERANCE_MILLI` of the
best (at most :data:`MAX_RERANKED` of them, best first), :class:`LookAhead` re-ranks by

    growth(task on n) + sum_k p_k min(best growth of class k on any other node,
                                      growth of class k on n once the task is there)

the expected growth of the next arrival, placed greedily after this one (a class that
then fits nowhere counts :data:`WHOLE` milli-GPU per GPU it asks). The look-ahead judges
the next arrival without its GPU-type constraint (every class as if it accepted every GPU
model): on openb ``gpuspec25`` (seed 42, unallocated GPU % at 100 % arrived demand) the
look-ahead with the constraints left 6.71 %, without them 6.36 %, the order without a
look-ahead 6.44 %. Everything is in milli-GPU.

Opt-in (``FragmentationScorer(look_ahead=True)``, ``hami simulate --policies
fragmentation-aware+lookahead``; no scheduler policy uses it), and only on the task mixes
it :func:`suits`: some GPU demand in whole GPUs (on openb it lost on ``gpushare100``,
shares alone, and gained on ``gpushare80`` to ``gpushare20``) and few tasks constrained to
GPU models (from ``gpuspec10`` on its gain was none or within the seeds' spread). Better
on openb ``default`` and ``multigpu50`` and equal elsewhere, but its decision p99 in
``bench/bench_filter.py`` is 1.4x-3x binpack's from run to run, not reliably within the
policy's 2x bound; docs/simulate.md has the figures.
The growth per node state is computed in plain Python and kept per state
(:mod:`~hami.core.fragmentation.nextrow`); :func:`next_growth` is its vectorised
reference, used for batches of many new states of a small mix.
"""

from __future__ import annotations

import numpy as np

from hami.core.fragmentation.measure import (
    WHOLE,
    BoolArray,
    FloatArray,
    IntArray,
    WorkloadDistribution,
)
from hami.core.fragmentation.nextrow import NextRows
from hami.core.fragmentation.state import FragmentationState

#: Candidates whose growth is at most this much (milli-GPU) above the best are re-ranked.
TOLERANCE_MILLI = 100.0
#: At most this many candidates (the best by growth, then by less free GPU) are re-ranked.
MAX_RERANKED = 16
#: Rows of hypothetical node states computed at once (bounds the ``[rows, G, K, K]`` work).
_CHUNK = 16
#: Task shapes whose per-node growth after them is kept (all dropped beyond).
_AFTER_SHAPES = 64
#: The look-ahead applies to a mix where at least this share of the GPU demand (weight x
#: GPUs x share per GPU) is in classes that are not single-GPU shares ...
MIN_WHOLE_DEMAND = 0.1
#: ... and at most this share of the tasks (by weight) accepts only some GPU models.
MAX_CONSTRAINED = 0.075


def suits(dist: WorkloadDistribution, min_whole_demand: float = MIN_WHOLE_DEMAND,
          max_constrained: float = MAX_CONSTRAINED) -> bool:
    """Whether the look-ahead applies to the task mix ``dist``: at least
    ``min_whole_demand`` of its GPU demand is in classes that are not single-GPU shares,
    and at most ``max_constrained`` of its tasks (by weight) accept only some GPU models
    (the look-ahead judges the next arrival as if every class accepted every model)."""
    demand = dist.weight * dist.num_gpu * dist.gpu_milli
    total = float(demand.sum())
    if total <= 0:
        return False
    share = (dist.num_gpu == 1) & (dist.gpu_milli > 0) & (dist.gpu_milli < WHOLE)
    constrained = sum(w for w, m in zip(dist.weight.tolist(), dist.models, strict=True) if m)
    return (float(demand[~share].sum()) / total >= min_whole_demand
            and constrained <= max_constrained)


def next_growth(dist: WorkloadDistribution, free: IntArray, cpu_free: IntArray,
                mem_free: IntArray) -> FloatArray:
    """``[R, K]``: growth of the expected fragmentation if one task of class ``k`` goes
    on node state ``r`` (for a GPU share, on the GPU where it grows least); ``inf`` where
    the class does not fit. GPU-type constraints are ignored (every class accepts every
    GPU). ``free`` is ``[R, G]`` milli-GPU free per GPU (pad with 0: a GPU with nothing
    free changes no term), ``cpu_free``/``mem_free`` are ``[R]``. Same values as
    :func:`~hami.core.fragmentation.measure.frag_delta` with every model accepted.
    """
    rows = free.shape[0]
    out = np.full((rows, dist.size), np.inf)
    k = _Classes.of(dist)
    for start in range(0, rows, _CHUNK):
        part = slice(start, start + _CHUNK)
        out[part] = _next_growth(k, free[part].astype(np.float64),
                                 cpu_free[part].astype(np.float64),
                                 mem_free[part].astype(np.float64))
    return out


class _Classes:
    """Per-class constants of a mix for :func:`next_growth` (made once per mix)."""

    _last: tuple[WorkloadDistribution, _Classes] | None = None

    def __init__(self, dist: WorkloadDistribution) -> None:
        self.size = dist.size
        self.need = dist.need().astype(np.float64)
        self.cpu = dist.cpu_milli.astype(np.float64)
        self.mem = dist.memory_mib.astype(np.float64)
        self.num_gpu = dist.num_gpu
        self.gpu_free = dist.num_gpu == 0
        self.weight = dist.weight
        milli = dist.gpu_milli.astype(np.float64)
        share = (dist.num_gpu == 1) & (milli > 0) & (milli < WHOLE)
        self.shares = np.flatnonzero(share)
        self.share_milli = milli[self.shares]
        self.whole = np.flatnonzero(~share)
        n = dist.num_gpu[self.whole].astype(np.float64)
        self.whole_gpus = n
        self.whole_taken = np.where(milli[self.whole] > 0, WHOLE, 0) * n
        self.whole_c_drop = n[:, None] * (self.need <= WHOLE)

    @classmethod
    def of(cls, dist: WorkloadDistribution) -> _Classes:
        last = cls._last
        if last is None or last[0] is not dist:
            last = cls._last = (dist, cls(dist))
        return last[1]


def _frag(k: _Classes, total: FloatArray, s: FloatArray, c: FloatArray,
          host: BoolArray) -> FloatArray:
    """Expected fragmentation of states with terms ``total [...]``, ``s``/``c``
    ``[..., K]`` and ``host`` (CPU and memory fit) ``[..., K]``, every model accepted."""
    ok = host & (k.gpu_free | (c >= k.num_gpu))
    result: FloatArray = np.where(ok, s, total[..., None]) @ k.weight
    return result


def _next_growth(k: _Classes, f: FloatArray, cpu: FloatArray,
                 mem: FloatArray) -> FloatArray:
    rows, gpus = f.shape
    small = f[..., None] < k.need                             # [R, G, J]
    total = f.sum(axis=1)                                     # [R]
    s = (f[..., None] * small).sum(axis=1)                    # [R, J]
    c = gpus - small.sum(axis=1).astype(np.float64)           # [R, J]
    before = _frag(k, total, s, c, (cpu[:, None] >= k.cpu) & (mem[:, None] >= k.mem))
    cpu2 = cpu[:, None] - k.cpu                               # [R, K]: after the task
    mem2 = mem[:, None] - k.mem
    fits = (cpu2 >= 0) & (mem2 >= 0)
    out = np.full((rows, k.size), np.inf)
    if k.whole.size:
        w = k.whole
        t2 = total[:, None] - k.whole_taken                               # [R, W]
        c2 = c[:, None, :] - k.whole_c_drop                               # [R, W, J]
        host = ((cpu2[:, w, None] >= k.cpu) & (mem2[:, w, None] >= k.mem))
        g = _frag(k, t2, np.broadcast_to(s[:, None, :], c2.shape), c2, host)
        room = (f >= WHOLE).sum(axis=1)[:, None] >= k.whole_gpus
        out[:, w] = np.where(fits[:, w] & room, g - before[:, None], np.inf)
    if k.shares.size:
        # Every (state, GPU) pair takes each share; the GPU where it grows least counts.
        sh, r = k.shares, k.share_milli
        g2 = f[..., None] - r                                             # [R, G, S]
        left = g2[..., None]                                              # [R, G, S, 1]
        ds = (np.where(left < k.need, left, 0.0)
              - (f[..., None] * small)[:, :, None, :])                    # [R, G, S, J]
        dc = (left >= k.need).astype(np.float64) - (~small)[:, :, None, :]
        host = ((cpu2[:, sh, None] >= k.cpu) & (mem2[:, sh, None] >= k.mem))[:, None]
        g = _frag(k, (total[:, None] - r)[:, None, :].repeat(gpus, axis=1),
                  s[:, None, None, :] + ds, c[:, None, None, :] + dc, host)
        least = np.where(g2 >= 0, g, np.inf).min(axis=1)                  # [R, S]
        out[:, sh] = np.where(fits[:, sh], least - before[:, None], np.inf)
    result: FloatArray = np.round(out, 6)
    return result


class LookAhead:
    """Re-ranks the near-best candidates of the ``fragmentation-aware`` order by the
    expected growth of the next arrival (module docstring). Keeps a ``[N, K]`` table of
    :func:`next_growth` per node, refreshed for the nodes whose statistics changed
    (:attr:`FragmentationState.node_version`) when a re-rank needs it; :meth:`reset`
    drops it (new mix or node set)."""

    def __init__(self, min_whole_demand: float = MIN_WHOLE_DEMAND,
                 max_constrained: float = MAX_CONSTRAINED) -> None:
        #: The mixes it applies to (:func:`suits`).
        self.min_whole_demand = min_whole_demand
        self.max_constrained = max_constrained
        self._table = np.zeros((0, 0))
        self._best = _Least(self._table)
        self._version = np.zeros(0, dtype=np.int64)
        #: Per task shape: the ``[N, K]`` next-arrival growth on each node once the task
        #: is there, and the node versions it was computed at.
        self._after: dict[tuple[int, int, int, int], tuple[FloatArray, IntArray]] = {}
        self._rows: NextRows | None = None
        self._rows_dist: WorkloadDistribution | None = None
        self._suits: tuple[WorkloadDistribution, bool] | None = None

    def suits(self, dist: WorkloadDistribution) -> bool:
        """:func:`suits` for ``dist``, kept for the last mix asked about."""
        if self._suits is None or self._suits[0] is not dist:
            self._suits = (dist, suits(dist, self.min_whole_demand, self.max_constrained))
        return self._suits[1]

    def reset(self) -> None:
        """Forget the tables (the mix or the node set changed)."""
        self._table = np.zeros((0, 0))
        self._after.clear()
        self._rows = self._rows_dist = None

    def _next_rows(self, dist: WorkloadDistribution) -> NextRows:
        """The per-state growth cache for ``dist`` (a new one for a new mix)."""
        if self._rows is None or self._rows_dist is not dist:
            self._rows, self._rows_dist = NextRows(dist), dist
        return self._rows

    def rerank(self, state: FragmentationState, ordered: IntArray, deltas: FloatArray, *,
               request_milli: int, num_gpu: int, cpu_milli: int, memory_mib: int
               ) -> IntArray:
        """``ordered`` (candidates by growth ``deltas``, ties by less free GPU) with its
        near-best head re-ranked by growth + the next arrival's expected growth (ties:
        less free GPU, then the given order). The task takes, on each candidate, the
        fullest GPU that fits (a share) or ``num_gpu`` wholly free GPUs."""
        head = min(ordered.size, MAX_RERANKED)
        near = ordered[:head][deltas[:head] <= deltas[0] + TOLERANCE_MILLI]
        if near.size < 2:
            return ordered
        dist = state.dist
        n, k = state.total.shape[0], dist.size
        if self._table.shape != (n, k):
            self._table = np.full((n, k), np.inf)
            self._best = _Least(self._table)
            self._version = np.full(n, -1, dtype=np.int64)
            self._after.clear()
        key = (request_milli, num_gpu, cpu_milli, memory_mib)
        entry = self._after.get(key)
        if entry is None:
            if len(self._after) >= _AFTER_SHAPES:
                self._after.clear()
            entry = self._after[key] = (np.full((n, k), np.inf),
                                        np.full(n, -1, dtype=np.int64))
        after_table, after_version = entry
        # The table's stale nodes, then the candidates (with the task) whose state changed
        # since their growth for this task shape was computed, state by state in plain
        # Python (NextRows: the same values as next_growth, kept per node state).
        rows = self._next_rows(dist)
        stale = np.flatnonzero(self._version != state.node_version)
        if stale.size:
            values = _growths(rows, dist, [_state_of(state, i) for i in stale.tolist()])
            self._best.update(self._table, stale, np.array(values, dtype=np.float64))
            self._version[stale] = state.node_version[stale]
        todo = near[after_version[near] != state.node_version[near]]
        if todo.size:
            after_table[todo] = _growths(rows, dist, [_with_task(
                state, i, request_milli=request_milli, num_gpu=num_gpu, cpu_milli=cpu_milli,
                memory_mib=memory_mib) for i in todo.tolist()])
            after_version[todo] = state.node_version[todo]
        after = after_table[near]                                           # [M, K]
        best = self._best
        other = np.where(best.first[None, :] == near[:, None], best.second[None, :],
                         best.least[None, :])
        nxt = np.minimum(other, after)
        nxt = np.where(nxt == np.inf, float(WHOLE) * dist.num_gpu, nxt)
        score = deltas[:near.size] + nxt @ dist.weight
        new = near[np.lexsort((state.total[near], score))]  # stable: then the given order
        return new if near.size == ordered.size else np.concatenate([new, ordered[near.size:]])


class _Least:
    """Per column of a ``[N, K]`` table (per class): the least value, a row holding it
    (:attr:`first`), and the least value of the other rows (:attr:`second`), kept up to
    date as rows change; a column is searched again only when a row holding its least or
    second value grows. Which of tied rows is :attr:`first` does not matter: the others
    then hold :attr:`second` = :attr:`least`."""

    #: Above this many changed rows at once, every column is searched again.
    FEW_ROWS = 8

    def __init__(self, table: FloatArray) -> None:
        k = table.shape[1]
        self.first = np.zeros(k, dtype=np.int64)
        self.least = np.full(k, np.inf)
        self.second_row = np.zeros(k, dtype=np.int64)
        self.second = np.full(k, np.inf)
        if table.shape[0]:
            self._search(table, np.arange(k))

    def _search(self, table: FloatArray, cols: IntArray) -> None:
        part = table[:, cols]
        first = np.argmin(part, axis=0)
        at = np.arange(cols.size)
        self.first[cols], self.least[cols] = first, part[first, at]
        part[first, at] = np.inf
        second = np.argmin(part, axis=0)
        self.second_row[cols], self.second[cols] = second, part[second, at]

    def update(self, table: FloatArray, rows: IntArray, values: FloatArray) -> None:
        """Set ``table[rows] = values`` (``[len(rows), K]``) and the per-column values."""
        if rows.size > self.FEW_ROWS:
            table[rows] = values
            self._search(table, np.arange(table.shape[1]))
            return
        first, least = self.first.tolist(), self.least.tolist()
        second_row, second = self.second_row.tolist(), self.second.tolist()
        redo: set[int] = set()
        for i, new in zip(rows.tolist(), values.tolist(), strict=True):
            old = table[i].tolist()
            for k, v in enumerate(new):
                if first[k] == i:
                    if v > old[k]:
                        redo.add(k)
                    least[k] = v
                elif v < least[k]:
                    second[k], second_row[k] = least[k], first[k]
                    least[k], first[k] = v, i
                else:
                    if second_row[k] == i and v > old[k]:
                        redo.add(k)
                    if v < second[k]:
                        second[k], second_row[k] = v, i
            table[i] = new
        self.first, self.least = np.array(first), np.array(least)
        self.second_row, self.second = np.array(second_row), np.array(second)
        if redo:
            self._search(table, np.array(sorted(redo)))


#: At least this many states missing from the cache go through :func:`next_growth` at
#: once when the mix is small (:attr:`NextRows.share_cells`), where one vectorised call
#: costs less than the states one by one in Python.
_BATCH = 8
_BATCH_CELLS = 256


def _growths(rows: NextRows, dist: WorkloadDistribution,
             states: list[tuple[list[int], int, int]]) -> list[tuple[float, ...]]:
    """:meth:`NextRows.growth` of each ``(free, cpu_free, mem_free)`` state; the missing
    ones vectorised when many and the mix small (same values)."""
    if len(states) >= _BATCH and rows.share_cells <= _BATCH_CELLS:
        missing: dict[tuple[tuple[int, ...], int, int], tuple[int, int]] = {}
        for free, cpu, mem in states:
            key = rows.key(free, cpu, mem)
            if not rows.known(key):
                missing[key] = (cpu, mem)
        if len(missing) >= _BATCH:
            width = max(1, max(len(key[0]) for key in missing))
            free_rows = np.zeros((len(missing), width), dtype=np.int64)
            for r, key in enumerate(missing):
                free_rows[r, :len(key[0])] = key[0]
            host = np.array(list(missing.values()), dtype=np.int64)
            table = next_growth(dist, free_rows, host[:, 0], host[:, 1])
            for key, values in zip(missing, table.tolist(), strict=True):
                rows.store(key, tuple(values))
    return [rows.growth(*s) for s in states]


def _state_of(state: FragmentationState, node: int) -> tuple[list[int], int, int]:
    """Node ``node``'s GPUs' free shares, free CPU and free memory."""
    row = state.row(node)
    return list(row.free), row.cpu_free, row.mem_free


def _with_task(state: FragmentationState, node: int, *, request_milli: int, num_gpu: int,
               cpu_milli: int, memory_mib: int) -> tuple[list[int], int, int]:
    """:func:`_state_of` once the task is on the node: a share on the fullest GPU that
    fits (the first such; the first GPU when none does), whole GPUs on the first
    ``num_gpu`` wholly free ones."""
    free, cpu, mem = _state_of(state, node)
    if not free:
        free = [0]
    if num_gpu == 1 and 0 < request_milli < WHOLE:
        room = [f if f >= request_milli else WHOLE + 1 for f in free]
        free[room.index(min(room))] -= request_milli
    elif num_gpu > 0:
        left = num_gpu
        for g, f in enumerate(free):
            if left and f >= WHOLE:
                free[g] = 0
                left -= 1
    return free, cpu - cpu_milli, mem - memory_mib
