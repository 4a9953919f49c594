"""How much GPU can any scheduler, even an offline one, place on an openb workload by the
moment its arrived GPU demand reaches 100 % of capacity? Two LP upper bounds, reported
as the least unallocated GPU % any scheduler can leave (next to what the live
``fragmentation-aware`` order leaves, with ``--replay``).

The protocol is ``hami simulate``'s (the paper's): the workload is inflated to 1.3x
capacity and shuffled with the seed (:func:`hami.sim.workload.prepare_workload`); the pods
that have arrived when the arrived GPU demand (placed or not) first reaches 100 % are the
prefix up to and including the pod that crosses it (:meth:`hami.sim.replay.Replayer.run`).
No pod is deleted, so no placement of those pods, in any order, by any rule, allocates more
than the largest set of them that fits the nodes at once. Both bounds relax that packing:

* ``aggregate``: pods grouped into classes (CPU, memory, GPUs, share, allowed models) and
  nodes into types (CPU, memory, GPUs, model); ``x[c, t] >= 0`` pods of class ``c`` on
  type ``t`` (only where one such pod fits one such node and the model is allowed),
  ``sum_t x[c, t] <= count[c]``; per type the CPU, memory and GPU milli of its pods are at
  most the type's total. Maximises the GPU milli placed. Any pod may be left out, CPU-only
  pods included (which only loosens the bound).
* ``gpu-patterns``: the same, except that GPUs are bins: a type's GPUs are split into whole
  GPUs taken by whole-GPU pods (``gpu_milli`` 1000, ``num_gpu`` of them) and GPUs holding a
  pattern of shares that add up to at most 1000 milli; the number of GPUs per pattern is
  continuous (column generation, patterns priced by an unbounded knapsack on 10-milli
  units). A pod with ``num_gpu`` k shares puts k items of its share into patterns.

CPU and memory stay pooled per node type in both (a node's CPU cannot really serve another
node's GPUs), and the counts are continuous, so both are upper bounds on the GPU placed:
the unallocated GPU % they report is a lower bound for every scheduler.

Run (needs scipy, a dev extra; the trace is read where it lies, never copied)::

    PYTHONPATH=src python bench/bound_openb.py --trace /path/to/openb \
        --workload gpushare100 --seed 42 [--replay]

Prints one JSON object per line: workload, seed, capacity, arrived demand and pods, the
bounds (GPU placed, unallocated %), and with ``--replay`` the live order's unallocated %.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from hami.sim.trace import TraceNode, TracePod, load_trace
from hami.sim.workload import DEFAULT_TUNE, prepare_workload

#: Share granularity of the trace (every ``gpu_milli`` is a multiple of 10).
UNIT_MILLI = 10


@dataclass(frozen=True)
class PodClass:
    """Pods of one shape; ``models`` empty = any GPU model."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    models: tuple[str, ...]

    @property
    def gpu_demand_milli(self) -> int:
        """GPU milli one pod of the class asks."""
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True)
class NodeType:
    """Nodes of one shape (a trace node list row less its name)."""

    cpu_milli: int
    memory_mib: int
    gpu: int
    model: str


def arrived_at(pods: Sequence[TracePod], capacity_milli: int,
               point_percent: int = 100) -> list[TracePod]:
    """The prefix of ``pods`` that has arrived when arrived GPU demand first reaches
    ``point_percent`` % of capacity (the replay's rule, crossing pod included)."""
    arrived = 0
    for k, pod in enumerate(pods):
        arrived += pod.num_gpu * pod.gpu_milli
        if arrived * 100 >= point_percent * capacity_milli:
            return list(pods[: k + 1])
    return list(pods)


def fits(c: PodClass, t: NodeType) -> bool:
    """Can one pod of class ``c`` run on an empty node of type ``t``?"""
    if c.cpu_milli > t.cpu_milli or c.memory_mib > t.memory_mib or c.num_gpu > t.gpu:
        return False
    return not (c.num_gpu and c.models and t.model not in c.models)


def classes_and_types(pods: Sequence[TracePod], nodes: Sequence[TraceNode]) -> tuple[
        list[PodClass], list[int], list[NodeType], list[int]]:
    """Pod classes with their counts, node types with their counts."""
    pc = Counter(PodClass(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli if p.num_gpu else 0,
                          tuple(sorted(set(p.gpu_spec))) if p.num_gpu else ()) for p in pods)
    nt = Counter(NodeType(n.cpu_milli, n.memory_mib, n.gpu, n.model) for n in nodes)
    classes, types = list(pc), list(nt)
    return classes, [pc[c] for c in classes], types, [nt[t] for t in types]


class BoundLP:
    """The LP over ``x[c, t]`` (pairs where a pod fits) and, for ``gpu-patterns``,
    ``y[p, t]`` (GPUs of type ``t`` holding share pattern ``p``)."""

    def __init__(self, classes: list[PodClass], counts: list[int], types: list[NodeType],
                 type_counts: list[int], patterns: bool) -> None:
        self.classes, self.counts, self.types, self.type_counts = classes, counts, types, type_counts
        self.patterns = patterns
        self.pairs = [(c, t) for c in range(len(classes)) for t in range(len(types))
                      if fits(classes[c], types[t])]
        self.sizes = sorted({c.gpu_milli for c in classes if 0 < c.gpu_milli < 1000})
        #: Per type, the share patterns (count per size in :attr:`sizes`) available.
        self.columns: list[list[tuple[int, ...]]] = [[] for _ in types]
        if patterns:  # start: one item of each size alone on a GPU
            for t in range(len(types)):
                for i in range(len(self.sizes)):
                    col = [0] * len(self.sizes)
                    col[i] = 1
                    self.columns[t].append(tuple(col))

    def solve(self) -> tuple[float, np.ndarray | None]:
        """Maximise GPU placed; returns (GPU milli, duals of the type rows) ."""
        nc, nt, ns = len(self.classes), len(self.types), len(self.sizes)
        ycols = [(t, col) for t in range(nt) for col in self.columns[t]]
        nx, nvar = len(self.pairs), len(self.pairs) + len(ycols)
        cost = np.zeros(nvar)
        # rows: classes | cpu per type | memory per type | gpu per type | (t, size) links
        nrow = nc + 3 * nt + (nt * ns if self.patterns else 0)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []

        def put(r: int, j: int, v: float) -> None:
            rows.append(r)
            cols.append(j)
            vals.append(v)

        b = np.zeros(nrow)
        b[:nc] = self.counts
        for t, (nty, k) in enumerate(zip(self.types, self.type_counts, strict=True)):
            b[nc + t] = k * nty.cpu_milli
            b[nc + nt + t] = k * nty.memory_mib
            b[nc + 2 * nt + t] = k * nty.gpu * (1 if self.patterns else 1000)
        for j, (c, t) in enumerate(self.pairs):
            cls = self.classes[c]
            cost[j] = -cls.gpu_demand_milli
            put(c, j, 1)
            put(nc + t, j, cls.cpu_milli)
            put(nc + nt + t, j, cls.memory_mib)
            if not self.patterns:
                put(nc + 2 * nt + t, j, cls.gpu_demand_milli)
            elif cls.gpu_milli >= 1000:
                put(nc + 2 * nt + t, j, cls.num_gpu)
            elif cls.gpu_milli > 0:
                put(nc + 3 * nt + t * ns + self.sizes.index(cls.gpu_milli), j, cls.num_gpu)
        for i, (t, col) in enumerate(ycols):
            put(nc + 2 * nt + t, nx + i, 1)
            for s, n in enumerate(col):
                put(nc + 3 * nt + t * ns + s, nx + i, -n)
        a = coo_matrix((vals, (rows, cols)), shape=(nrow, nvar)).tocsr()
        res = linprog(cost, A_ub=a, b_ub=b, bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"LP not solved: {res.message}")
        return -float(res.fun), -np.asarray(res.ineqlin.marginals)

    def price(self, duals: np.ndarray) -> int:
        """Add every improving share pattern (one per node type); returns how many."""
        nc, nt, ns = len(self.classes), len(self.types), len(self.sizes)
        cap = 1000 // UNIT_MILLI
        units = [s // UNIT_MILLI for s in self.sizes]
        added = 0
        for t in range(nt):
            gpu_dual = duals[nc + 2 * nt + t]
            value = duals[nc + 3 * nt + t * ns: nc + 3 * nt + (t + 1) * ns]
            best = np.zeros(cap + 1)
            pick = np.full(cap + 1, -1)
            for u in range(1, cap + 1):  # unbounded knapsack on 10-milli units
                best[u], pick[u] = best[u - 1], -1
                for s, w in enumerate(units):
                    if w <= u and best[u - w] + value[s] > best[u] + 1e-12:
                        best[u], pick[u] = best[u - w] + value[s], s
            if best[cap] <= gpu_dual + 1e-7:
                continue
            col = [0] * ns
            u = cap
            while u > 0:
                if pick[u] < 0:
                    u -= 1
                    continue
                col[pick[u]] += 1
                u -= units[pick[u]]
            if tuple(col) not in self.columns[t]:
                self.columns[t].append(tuple(col))
                added += 1
        return added

    def bound_milli(self, max_rounds: int = 200) -> float:
        """The LP optimum (GPU milli placed), generating patterns until none improves."""
        value, duals = self.solve()
        for _ in range(max_rounds if self.patterns else 0):
            if duals is None or not self.price(duals):
                break
            value, duals = self.solve()
        return value


def replay_unallocated(nodes: list[TraceNode], trace_pods: list[TracePod],
                       pods: list[TracePod], seed: int) -> float:
    """The live ``fragmentation-aware`` order's unallocated GPU % at 100 % arrived demand."""
    from hami.sim.replay import FRAGMENTATION_AWARE, replay, workload_distribution

    result = replay(nodes, pods, FRAGMENTATION_AWARE, workload_distribution(trace_pods), seed)
    return result.unallocated(100)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True, type=Path)
    ap.add_argument("--workload", default="default")
    ap.add_argument("--seed", type=int, action="append", required=True)
    ap.add_argument("--replay", action="store_true",
                    help="also replay fragmentation-aware on the seed")
    args = ap.parse_args(argv)
    nodes, trace_pods = load_trace(args.trace, args.workload)
    cap = 1000 * sum(n.gpu for n in nodes)
    for seed in args.seed:
        pods = prepare_workload(trace_pods, cap, seed, DEFAULT_TUNE)
        arrived = arrived_at(pods, cap)
        classes, counts, types, type_counts = classes_and_types(arrived, nodes)
        out: dict[str, object] = {
            "workload": args.workload, "seed": seed, "capacity_milli": cap,
            "arrived_pods": len(arrived),
            "arrived_demand_percent": round(100 * sum(p.gpu_demand_milli for p in arrived)
                                            / cap, 3),
            "classes": len(classes), "node_types": len(types)}
        for name, patterns in (("aggregate", False), ("gpu-patterns", True)):
            placed = BoundLP(classes, counts, types, type_counts, patterns).bound_milli()
            out[name] = {"placed_milli": round(placed, 1),
                         "unallocated_percent": round(100 - 100 * placed / cap, 3)}
        if args.replay:
            out["fragmentation-aware"] = round(
                replay_unallocated(nodes, trace_pods, pods, seed), 3)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
