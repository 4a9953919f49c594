"""One node's fragment terms and growth in plain Python, for the few nodes a decision changes.

An ordinary decision changes one node (the one the last pod went to), so the per-node
state (:class:`~hami.core.fragmentation.state.FragmentationState`) and the cached growth
per request shape (:class:`~hami.core.fragmentation.order.FragmentationScorer`) are
refreshed for a node of a few GPUs and ``K`` task classes: a few dozen numbers, where
each numpy call costs more than its arithmetic. These functions compute the same
formulas as :mod:`~hami.core.fragmentation.measure` (:func:`class_terms`,
:func:`fragment`, :func:`frag_delta`) on Python numbers. The terms are whole numbers, so
exactly equal; the weighted sum over classes may differ from numpy's in the last bit (as
numpy's own sums differ with the batch shape), which the growth's rounding to 6 decimals
(:func:`round6`, as ``numpy.round``) absorbs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hami.core.fragmentation.measure import WHOLE, WorkloadDistribution


@dataclass(frozen=True, slots=True)
class Classes:
    """A :class:`WorkloadDistribution`'s per-class columns as Python tuples (length ``K``):
    the free share a GPU needs (milli-GPU, 0 for CPU-only classes), GPUs per task, CPU
    milli, memory MiB and popularity weight."""

    need: tuple[float, ...]
    num_gpu: tuple[int, ...]
    cpu_milli: tuple[int, ...]
    memory_mib: tuple[int, ...]
    weight: tuple[float, ...]

    @classmethod
    def of(cls, dist: WorkloadDistribution) -> Classes:
        """The columns of ``dist``."""
        return cls(tuple(dist.need().tolist()), tuple(dist.num_gpu.tolist()),
                   tuple(dist.cpu_milli.tolist()), tuple(dist.memory_mib.tolist()),
                   tuple(dist.weight.tolist()))


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node's state as Python numbers: its GPUs' free shares (milli-GPU), free CPU
    (milli) and memory (MiB), whether each class accepts its GPU model, and its terms:
    ``total`` free GPU, per class ``s`` (free GPU on GPUs too small for it) and ``c``
    (GPUs it can use), and ``frag``, the expected fragmentation (milli-GPU)."""

    free: tuple[int, ...]
    cpu_free: int
    mem_free: int
    models_ok: tuple[bool, ...]
    total: float
    s: tuple[float, ...]
    c: tuple[float, ...]
    frag: float


def node_row(free: Sequence[int], cpu_free: int, mem_free: int, models_ok: Sequence[bool],
             classes: Classes) -> NodeRow:
    """The terms of a node whose GPUs have ``free`` shares (:func:`class_terms` for one
    node) and its expected fragmentation ``sum_k p_k F_n(k)`` (:func:`fragment`)."""
    total = float(sum(free))
    s: list[float] = []
    c: list[float] = []
    frag = 0.0
    for need, gpus, cpu, mem, weight, ok in zip(classes.need, classes.num_gpu,
                                                classes.cpu_milli, classes.memory_mib,
                                                classes.weight, models_ok, strict=True):
        small = 0
        usable = 0
        for f in free:
            if f < need:
                small += f
            else:
                usable += 1
        s.append(float(small))
        c.append(float(usable))
        host = ok and cpu_free >= cpu and mem_free >= mem and (gpus == 0 or usable >= gpus)
        frag += weight * (small if host else total)
    return NodeRow(tuple(free), cpu_free, mem_free, tuple(models_ok), total, tuple(s),
                   tuple(c), frag)


def round6(x: float) -> float:
    """``numpy.round(x, 6)`` for a finite float: ``rint(x * 1e6) / 1e6`` (half to even)."""
    return round(x * 1e6) / 1e6


def share_growth(row: NodeRow, classes: Classes, *, request_milli: int, cpu_milli: int,
                 memory_mib: int) -> float:
    """The least :func:`frag_delta` over the node's GPUs with at least ``request_milli``
    (``0 < request_milli < 1000``) free, for one GPU share with ``cpu_milli`` and
    ``memory_mib``; ``inf`` when no GPU has that much free. GPUs with the same free
    share grow it alike, so each distinct share is computed once."""
    best = math.inf
    cpu_after, mem_after = row.cpu_free - cpu_milli, row.mem_free - memory_mib
    hosts = [ok and cpu_after >= cpu and mem_after >= mem
             for ok, cpu, mem in zip(row.models_ok, classes.cpu_milli, classes.memory_mib,
                                     strict=True)]
    total_after = row.total - request_milli
    for f in sorted({f for f in row.free if f >= request_milli}):
        g = f - request_milli
        after = 0.0
        for need, gpus, weight, host, s, c in zip(classes.need, classes.num_gpu,
                                                  classes.weight, hosts, row.s, row.c,
                                                  strict=True):
            if host:
                s2 = s - (f if f < need else 0.0) + (g if g < need else 0.0)
                c2 = c - (f >= need) + (g >= need)
                after += weight * (s2 if gpus == 0 or c2 >= gpus else total_after)
            else:
                after += weight * total_after
        best = min(best, round6(after - row.frag))
    return best


def node_growth(row: NodeRow, classes: Classes, *, request_milli: int, num_gpu: int,
                cpu_milli: int, memory_mib: int) -> float:
    """:func:`frag_delta` of a request that is not a GPU share on the node: whole GPUs
    (``num_gpu`` fully free GPUs become full) or none (only CPU and memory change)."""
    gpu_change = not (num_gpu == 0 or request_milli == 0)
    total_after = row.total - WHOLE * num_gpu if gpu_change else row.total
    cpu_after, mem_after = row.cpu_free - cpu_milli, row.mem_free - memory_mib
    after = 0.0
    for need, gpus, cpu, mem, weight, ok, s, c in zip(
            classes.need, classes.num_gpu, classes.cpu_milli, classes.memory_mib,
            classes.weight, row.models_ok, row.s, row.c, strict=True):
        c2 = c - num_gpu * (need <= WHOLE) if gpu_change else c
        host = (ok and cpu_after >= cpu and mem_after >= mem and (gpus == 0 or c2 >= gpus))
        after += weight * (s if host else total_after)
    return round6(after - row.frag)
