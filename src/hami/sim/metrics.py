"""Packing metrics of the paper's evaluation (Weng et al., USENIX ATC'23, §6.1-§6.2).

* **GPU allocation ratio**: GPU granted to running pods (sum over pods of ``num_gpu x
  gpu_milli``; in HAMi terms the booked cores) as % of cluster GPU capacity.
* **Unallocated GPU %** = 100 - allocation ratio, read when the *arrived* GPU demand (all
  pods submitted so far, placed or not) first reaches x % of capacity (Fig. 9a plots it
  for x = 0..130).
* **Fragmentation** (§3): the cluster's expected fragmented GPU under the workload's task
  distribution (:mod:`hami.core.fragmentation`), as % of capacity ("Frag/Total") and as %
  of idle GPU ("Frag Rate").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from hami.core.fragmentation import (
    WorkloadDistribution,
    ledger_inputs,
    model_mask,
    node_fragmentation,
)
from hami.core.ledger import UsageLedger


def capacity_milli(ledger: UsageLedger) -> int:
    """Cluster GPU capacity in milli-GPU (every registered healthy GPU counts 1000)."""
    n = ledger.size
    return 1000 * int((ledger.healthy[:n] & (ledger.node_of[:n] >= 0)).sum())


def allocated_milli(ledger: UsageLedger) -> int:
    """GPU booked by pods, milli-GPU: used cores over card cores, summed (1000 per card).

    A card counts at most 1000: MIG profiles' cores are rounded up (HAMi v2.10), so seven
    ``1g`` instances of an A100 book 105 of its 100 cores.
    """
    n = ledger.size
    total = np.maximum(ledger.total_cores[:n], 1)
    used = np.minimum(ledger.used_cores[:n], ledger.total_cores[:n])
    return int((used * 1000 // total).sum())


def allocation_percent(ledger: UsageLedger, capacity: int | None = None) -> float:
    """GPU allocation ratio, % of capacity."""
    cap = capacity if capacity is not None else capacity_milli(ledger)
    return 100.0 * allocated_milli(ledger) / cap if cap else 0.0


def node_types(ledger: UsageLedger) -> list[str]:
    """Each node index's GPU type (empty for a node without GPUs)."""
    types = [""] * ledger.node_count
    for d in range(ledger.size):
        i = int(ledger.node_of[d])
        if i >= 0 and not types[i]:
            types[i] = ledger.type_names[int(ledger.type_id[d])]
    return types


def fragmentation_milli(ledger: UsageLedger, dist: WorkloadDistribution,
                        models_ok: np.ndarray | None = None) -> float:
    """The cluster's expected fragmented GPU (milli-GPU) under ``dist`` (paper §3.3)."""
    free, node_of, cpu_free, mem_free = ledger_inputs(ledger)
    if models_ok is None:
        models_ok = model_mask(node_types(ledger), dist)
    return float(node_fragmentation(free, node_of, cpu_free, mem_free, models_ok,
                                    dist).sum())


def idle_milli(ledger: UsageLedger) -> int:
    """Unallocated GPU, milli-GPU."""
    return capacity_milli(ledger) - allocated_milli(ledger)


def median_curve(curves: Iterable[Mapping[int, float]]) -> dict[int, float]:
    """Point-wise median over seeds, NaN values skipped (NaN if none is left)."""
    by_point: dict[int, list[float]] = {}
    for curve in curves:
        for point, value in curve.items():
            by_point.setdefault(point, [])
            if not math.isnan(value):
                by_point[point].append(value)
    return {p: (float(np.median(v)) if v else float("nan"))
            for p, v in sorted(by_point.items())}


def unallocated_curve(allocation: Mapping[int, float]) -> dict[int, float]:
    """``100 - allocation`` point-wise."""
    return {p: 100.0 - v for p, v in allocation.items()}


def summarize(results: Sequence[Any], points: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per policy: median unallocated %, fragmentation % and failures over seeds.

    ``results`` are :class:`~hami.sim.replay.ReplayResult` objects.
    """
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r.policy for r in results):
        mine = [r for r in results if r.policy == policy]
        unalloc = median_curve(unallocated_curve(r.allocation) for r in mine)
        frag = median_curve(r.fragmentation for r in mine)
        out[policy] = {
            "unallocated": {p: unalloc.get(p, float("nan")) for p in points},
            "unallocated_full": unalloc,
            "fragmentation": {p: frag.get(p, float("nan")) for p in points},
            "failed": float(np.median([r.failed for r in mine])),
            "pods": float(np.median([r.pods for r in mine])),
            "seconds": float(np.median([r.seconds for r in mine])),
        }
        if any(r.mig_final is not None for r in mine):
            out[policy]["mig"] = summarize_mig(mine, points)
    return out


#: The arrived-demand point (%) that picks the MIG report's replay (:func:`summarize_mig`).
MIG_POINT = 100


def summarize_mig(results: Sequence[Any], points: Sequence[int]) -> dict[str, Any]:
    """The MIG-mode GPUs' usage (:class:`~hami.sim.replay.MigUsage`) of one replay: the
    seed whose number of MIG instances at :data:`MIG_POINT` % arrived demand is the median
    (the lower one for an even number of seeds).

    One replay rather than per-column medians, so that the columns agree: the instances are
    the sum of the instances per profile, and the unallocated shares are what those
    profiles leave (medians over seeds are not additive).

    Returns ``seed``, ``gpus``; per point of ``points`` ``instances``, ``pods``,
    ``unallocated_cores``, ``unallocated_memory`` (%, NaN where the point was never
    reached) and ``profiles_at`` (instances per profile name); ``profiles``: instances
    per profile name at the end of the replay.
    """
    def key(r: Any) -> tuple[float, int]:
        usage = r.mig.get(MIG_POINT)
        return (usage.instances if usage is not None else -1.0, r.seed)

    mine = sorted((r for r in results if r.mig_final is not None), key=key)
    if not mine:
        return {"seed": None, "gpus": 0, "instances": {}, "pods": {},
                "unallocated_cores": {}, "unallocated_memory": {}, "profiles_at": {},
                "profiles": {}}
    rep = mine[(len(mine) - 1) // 2]

    def at(point: int, attr: str) -> float:
        usage = rep.mig.get(point)
        return float(getattr(usage, attr)) if usage is not None else float("nan")

    return {
        "seed": rep.seed,
        "gpus": rep.mig_final.gpus,
        "instances": {p: at(p, "instances") for p in points},
        "pods": {p: at(p, "pods") for p in points},
        "unallocated_cores": {p: at(p, "unallocated_cores_percent") for p in points},
        "unallocated_memory": {p: at(p, "unallocated_memory_percent") for p in points},
        "profiles_at": {p: dict(rep.mig[p].profiles) for p in points if p in rep.mig},
        "profiles": dict(rep.mig_final.profiles),
    }
