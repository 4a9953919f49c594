"""The look-ahead's next-arrival growth of one node state, in plain Python, cached by state.

:func:`~hami.core.fragmentation.lookahead.next_growth` computes, for node states (a node
now, or a candidate once the task is on it), the growth of the expected fragmentation if
one task of each class ``k`` came next. A decision needs it for a handful of states (the
node the last pod went to, and candidates whose state for this task shape is new), where
each of numpy's ~40 calls on ``[rows, GPUs, shares, classes]`` arrays costs more than its
arithmetic. :class:`NextRows` computes the same values on Python numbers and keeps them
per state: the growth depends on a node state only through its non-zero free shares (as
a multiset: a GPU with nothing free is no fragment and takes nothing) and which of the
mix's CPU and memory thresholds its free CPU and memory reach, so nodes alike share one
entry.

A GPU share ``r`` on a GPU with ``f`` free (``g = f - r`` left) changes class ``k``'s
fragment by regime (as :mod:`~hami.core.fragmentation.shares`): ``need_k > f``: ``S_k``
loses ``r``; ``g < need_k <= f``: ``S_k`` gains ``g`` and ``C_k`` loses one GPU;
``need_k <= g``: nothing. With the classes sorted by ``need_k`` the three regimes are
three runs, so the expected fragmentation after the share is

    (T - r) sum_k p_k + A[<= g] + r B[<= g] + A'(g, f] + f B'(g, f] + A(> f)

with prefix sums ``A = sum p_k h_k R_k (S_k - T)``, ``B = sum p_k h_k R_k`` (``R_k``: the
class still has its GPUs, ``h_k``: its CPU and memory fit after the share) and ``A'``,
``B'`` the same with one usable GPU fewer: ``O(K + shares x distinct free shares)`` per
state instead of ``O(K x shares x GPUs)``. The terms are whole numbers and the weighted
sums differ from numpy's in the last bits only, which the growth's rounding to 6 decimals
(as ``numpy.round``) absorbs; ``tests/sim/test_fragmentation_lookahead.py`` checks them
equal on random states.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from hami.core.fragmentation.measure import WHOLE, WorkloadDistribution
from hami.core.fragmentation.scalar import round6

#: Cached states kept at most (then the cache starts over).
MAX_STATES = 1 << 16

Key = tuple[tuple[int, ...], int, int]
#: Prefix sums over the classes by need: ``A``, ``B``, ``A'``, ``B'`` (module docstring).
Prefix = tuple[list[float], list[float], list[float], list[float]]


class NextRows:
    """Next-arrival growth per class of node states for one task mix (``dist``), as
    :func:`~hami.core.fragmentation.lookahead.next_growth` gives it (``inf`` where a
    class does not fit; every GPU model accepted), kept per state.

    States are ``(free, cpu_free, mem_free)``: the node's GPUs' free shares (milli-GPU,
    any order), free CPU (milli) and memory (MiB).
    """

    def __init__(self, dist: WorkloadDistribution) -> None:
        k = dist.size
        self.size = k
        need = [float(x) for x in dist.need().tolist()]
        self.num_gpu: list[int] = dist.num_gpu.tolist()
        self.cpu: list[int] = dist.cpu_milli.tolist()
        self.mem: list[int] = dist.memory_mib.tolist()
        self.weight: list[float] = dist.weight.tolist()
        self.weight_sum = math.fsum(self.weight)
        milli: list[int] = dist.gpu_milli.tolist()
        #: Classes by need ascending, and their needs.
        self.order = sorted(range(k), key=lambda i: need[i])
        self.need = need
        self.sorted_need = [need[i] for i in self.order]
        # The thresholds a free CPU (memory) is compared with: a class's own, a class's
        # after another's, and a class's alone (does it fit).
        cpus, mems = set(self.cpu), set(self.mem)
        self.cpu_steps = sorted(cpus | {a + b for a in cpus for b in cpus})
        self.mem_steps = sorted(mems | {a + b for a in mems for b in mems})
        self.cpu_max, self.mem_max = max(self.cpu), max(self.mem)
        self.class_cpus, self.class_mems = sorted(cpus), sorted(mems)
        #: Share classes grouped by (share, CPU, memory) -> their classes; the rest
        #: (whole GPUs or none) by (GPUs, GPU taken, CPU, memory) -> their classes
        #: (classes that differ in GPU models alone grow alike here).
        shares: dict[tuple[int, int, int], list[int]] = {}
        whole: dict[tuple[int, int, int, int], list[int]] = {}
        for i in range(k):
            gpus = self.num_gpu[i]
            if gpus == 1 and 0 < milli[i] < WHOLE:
                shares.setdefault((milli[i], self.cpu[i], self.mem[i]), []).append(i)
            else:
                taken = (WHOLE if milli[i] > 0 else 0) * gpus
                whole.setdefault((gpus, taken, self.cpu[i], self.mem[i]), []).append(i)
        self.shares = [(*shape, tuple(js)) for shape, js in shares.items()]
        self.whole = [(*shape, tuple(js)) for shape, js in whole.items()]
        #: Share classes x classes: small enough that numpy's per-call cost, not its
        #: arithmetic, rules a vectorised batch of states.
        self.share_cells = sum(len(s[3]) for s in self.shares) * k
        #: Free CPU (memory) from which every class fits after any share class.
        self.cpu_all = max(s[1] for s in self.shares) + self.cpu_max if shares else 0
        self.mem_all = max(s[2] for s in self.shares) + self.mem_max if shares else 0
        self._cache: dict[Key, tuple[float, ...]] = {}
        #: Per (CPU, memory) position among the classes' values: which classes fit
        #: (by need order; None: all).
        self._hosts: dict[tuple[int, int], tuple[bool, ...] | None] = {}

    def key(self, free: Sequence[int], cpu_free: int, mem_free: int) -> Key:
        """The cache key of a state: its non-zero free shares sorted, and how many CPU and
        memory thresholds its free CPU and memory reach."""
        return (tuple(sorted(f for f in free if f)), bisect_right(self.cpu_steps, cpu_free),
                bisect_right(self.mem_steps, mem_free))

    def known(self, key: Key) -> bool:
        """Whether the state of cache key ``key`` is kept."""
        return key in self._cache

    def store(self, key: Key, values: tuple[float, ...]) -> None:
        """Keep ``values`` (computed elsewhere, e.g. vectorised) for the state ``key``."""
        if len(self._cache) >= MAX_STATES:
            self._cache.clear()
        self._cache[key] = values

    def growth(self, free: Sequence[int], cpu_free: int, mem_free: int) -> tuple[float, ...]:
        """Per class (``K`` values, the mix's order), the rounded growth of the expected
        fragmentation if one task of the class goes on this state next; ``inf`` where it
        does not fit."""
        key = self.key(free, cpu_free, mem_free)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) >= MAX_STATES:
                self._cache.clear()
            hit = self._cache[key] = self._compute(key[0], cpu_free, mem_free)
        return hit

    def _compute(self, free: tuple[int, ...], cpu: int, mem: int) -> tuple[float, ...]:
        k, order, need = self.size, self.order, self.need
        num_gpu, w, ccpu, cmem = self.num_gpu, self.weight, self.cpu, self.mem
        total = float(sum(free))
        # S_k (free on GPUs too small for k) and C_k (GPUs k can use), walking the
        # classes by need and the free shares ascending together.
        s = [0.0] * k
        c = [0.0] * k
        pos, small, g = 0, 0.0, len(free)
        for i in order:
            while pos < g and free[pos] < need[i]:
                small += free[pos]
                pos += 1
            s[i], c[i] = small, float(g - pos)
        gpu_free = [n == 0 for n in num_gpu]
        runs = [gf or ci >= n for gf, ci, n in zip(gpu_free, c, num_gpu, strict=True)]
        before = 0.0
        for i in range(k):
            ok = runs[i] and cpu >= ccpu[i] and mem >= cmem[i]
            before += w[i] * (s[i] if ok else total)
        out = [math.inf] * k
        whole_gpus = sum(1 for f in free if f >= WHOLE)
        for gpus, taken, cpu_j, mem_j, js in self.whole:
            cpu2, mem2 = cpu - cpu_j, mem - mem_j
            if cpu2 < 0 or mem2 < 0 or whole_gpus < gpus:
                continue
            t2 = total - taken
            after = 0.0
            for i in range(k):
                drop = gpus * (need[i] <= WHOLE)
                ok = ((gpu_free[i] or c[i] - drop >= num_gpu[i])
                      and cpu2 >= ccpu[i] and mem2 >= cmem[i])
                after += w[i] * (s[i] if ok else t2)
            value = round6(after - before)
            for j in js:
                out[j] = value
        if self.shares and free:
            self._shares(out, free, total, s, c, cpu, mem, before)
        return tuple(out)

    def _shares(self, out: list[float], free: tuple[int, ...], total: float,
                s: list[float], c: list[float], cpu: int, mem: int, before: float) -> None:
        """``out[j]`` for every share class ``j`` (the module docstring's prefix sums)."""
        order, ccpu, cmem, wsum = self.order, self.cpu, self.mem, self.weight_sum
        needs = self.sorted_need
        values = sorted(set(free))
        his = [bisect_right(needs, f) for f in values]
        sums: dict[tuple[bool, ...] | None, Prefix] = {}
        every = (self._prefix(None, total, s, c)
                 if cpu >= self.cpu_all and mem >= self.mem_all else None)
        hosts = self._hosts
        for r, cpu_j, mem_j, js in self.shares:
            cpu2, mem2 = cpu - cpu_j, mem - mem_j
            first = bisect_left(values, r)
            if cpu2 < 0 or mem2 < 0 or first == len(values):
                continue
            prefix = every
            if prefix is None:
                # Which classes fit the CPU and memory left: one set per pair of
                # positions among the classes' CPU and memory values.
                where = (bisect_right(self.class_cpus, cpu2), bisect_right(self.class_mems, mem2))
                if where in hosts:
                    host = hosts[where]
                else:
                    host = hosts[where] = (
                        None if cpu2 >= self.cpu_max and mem2 >= self.mem_max
                        else tuple(cpu2 >= ccpu[i] and mem2 >= cmem[i] for i in order))
                prefix = sums.get(host)
                if prefix is None:
                    prefix = sums[host] = self._prefix(host, total, s, c)
            a, b, a1, b1 = prefix
            base = (total - r) * wsum + a[-1]
            least = math.inf
            for pos in range(first, len(values)):
                f, hi = values[pos], his[pos]
                lo = bisect_right(needs, f - r)
                after = (base + a[lo] + r * b[lo] + (a1[hi] - a1[lo])
                         + f * (b1[hi] - b1[lo]) - a[hi])
                if after < least:
                    least = after
            value = round6(least - before)
            for j in js:
                out[j] = value

    def _prefix(self, host: tuple[bool, ...] | None, total: float, s: list[float],
                c: list[float]) -> Prefix:
        """Prefix sums over the classes by need of ``p h R (S - T)``, ``p h R`` and the
        same with one usable GPU fewer (``R'``); ``host`` per class in that order (None:
        all fit)."""
        a, b, a1, b1 = [0.0], [0.0], [0.0], [0.0]
        num_gpu, w = self.num_gpu, self.weight
        for pos, i in enumerate(self.order):
            n = num_gpu[i]
            h = host is None or host[pos]
            run = h and (n == 0 or c[i] >= n)
            run1 = h and (n == 0 or c[i] - 1 >= n)
            a.append(a[-1] + (w[i] * (s[i] - total) if run else 0.0))
            b.append(b[-1] + (w[i] if run else 0.0))
            a1.append(a1[-1] + (w[i] * (s[i] - total) if run1 else 0.0))
            b1.append(b1[-1] + (w[i] if run1 else 0.0))
        return a, b, a1, b1
