"""Node-level policy in DRA mode: scores for the extender's ``prioritize`` verb. Pure.

kube-scheduler's DRA allocator fits claims first-fit inside a node and does not score
nodes by device use. With the extender's ``prioritize`` verb only (no filter, no bind,
no node lock) hami ranks the nodes kube-scheduler found feasible by the share of their
cards' ``memory`` capacity that allocated claims consume:

* ``binpack``: fuller nodes first (score = used share x 10);
* ``spread``: emptier nodes first (score = (1 - used share) x 10).

Scores are integers 0..10 (kube-scheduler's ``MaxExtenderPriority``); a node without a
slice of ours scores 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra.slices import DRIVER, MEMORY

MAX_PRIORITY = 10
POLICIES = ("binpack", "spread")


def _q(raw: Any) -> int:
    try:
        return int(to_int_exact(quantity(raw)) or 0)
    except (QuantityError, ValueError, TypeError):
        return 0


def slice_capacity(s: Mapping[str, Any]) -> tuple[str, int] | None:
    """``(node, memory bytes of its cards)`` of one of our ResourceSlices; None for a
    slice of another driver or without a node."""
    spec = s.get("spec") or {}
    if spec.get("driver") != DRIVER or not spec.get("nodeName"):
        return None
    total = sum(_q(((d.get("capacity") or {}).get(MEMORY) or {}).get("value"))
                for d in spec.get("devices") or [] if isinstance(d, Mapping))
    return str(spec["nodeName"]), total


def claim_memory(c: Mapping[str, Any]) -> dict[str, int]:
    """Node (pool) -> memory bytes the claim's allocation consumes on our cards."""
    used: dict[str, int] = defaultdict(int)
    alloc = (c.get("status") or {}).get("allocation") or {}
    for r in (alloc.get("devices") or {}).get("results") or []:
        if isinstance(r, Mapping) and r.get("driver") == DRIVER:
            used[str(r.get("pool"))] += _q((r.get("consumedCapacity") or {}).get(MEMORY))
    return dict(used)


def memory_use(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
               ) -> dict[str, tuple[int, int]]:
    """Node -> ``(used bytes, capacity bytes)`` of our cards' ``memory``, from slice
    capacities and the ``consumedCapacity`` of allocated claims (results of our driver)."""
    cap: dict[str, int] = defaultdict(int)
    for s in slices:
        sc = slice_capacity(s)
        if sc is not None:
            cap[sc[0]] += sc[1]
    used: dict[str, int] = defaultdict(int)
    for c in claims:
        for node, n in claim_memory(c).items():
            used[node] += n
    return {node: (used.get(node, 0), total) for node, total in cap.items()}


def node_scores(nodes: Sequence[str], use: Mapping[str, tuple[int, int]],
                policy: str) -> list[dict[str, Any]]:
    """kube-scheduler's ``HostPriorityList``: ``[{"host", "score"}]`` for ``nodes``.

    Raises:
        ValueError: ``policy`` is not one of :data:`POLICIES`.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown node policy {policy!r}; valid: {', '.join(POLICIES)}")
    out = []
    for node in nodes:
        used, total = use.get(node, (0, 0))
        if total <= 0:
            out.append({"host": node, "score": 0})
            continue
        share = min(used / total, 1.0)
        value = share if policy == "binpack" else 1.0 - share
        out.append({"host": node, "score": round(value * MAX_PRIORITY)})
    return out
