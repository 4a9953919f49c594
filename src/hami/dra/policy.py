"""Node-level policy in DRA mode: scores for the extender's ``prioritize`` verb. Pure.

kube-scheduler's DRA allocator fits claims first-fit inside a node and does not score
nodes by device use. With the extender's ``prioritize`` verb only (no filter, no bind,
no node lock) hami ranks the nodes kube-scheduler found feasible by the share of their
cards' ``memory`` capacity that allocated claims consume (a MIG-mode card, published as
its instance devices, counts its memory once; an allocated instance uses its memory):

* ``binpack``: fuller nodes first (score = used share x 10);
* ``spread``: emptier nodes first (score = (1 - used share) x 10).

Scores are integers 0..10 (kube-scheduler's ``MaxExtenderPriority``); a node without a
slice of ours scores 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra import usage
from hami.dra.slices import DRIVER, MEMORY

MAX_PRIORITY = 10
POLICIES = ("binpack", "spread")


def _q(raw: Any) -> int:
    try:
        return int(to_int_exact(quantity(raw)) or 0)
    except (QuantityError, ValueError, TypeError):
        return 0


@dataclass(frozen=True, slots=True)
class SliceMemory:
    """The ``memory`` one of our ResourceSlices publishes (bytes).

    ``node``: the slice's ``spec.nodeName``; ``cards_bytes``: the summed capacity of its
    shareable cards; ``mig_bytes``: ``(card uuid, profile) ->`` summed capacity of the
    MIG instance devices of that card and profile in this slice (a card's instances may
    span slices: :func:`node_capacity` adds them up per node and card before taking
    :func:`hami.dra.usage.mig_card_total`); ``instances``: ``(pool, device name) ->``
    capacity of each MIG instance device (what an allocation of it uses)."""

    node: str
    cards_bytes: int
    mig_bytes: Mapping[tuple[str, str], int]
    instances: Mapping[tuple[str, str], int]


def _memory(device: Mapping[str, Any]) -> int:
    return max(_q(((device.get("capacity") or {}).get(MEMORY) or {}).get("value")), 0)


def slice_memory(s: Mapping[str, Any]) -> SliceMemory | None:
    """:class:`SliceMemory` of one ResourceSlice; None for a slice of another driver or
    without a node. Devices are told apart by :func:`hami.dra.usage.instance_profile`;
    anything malformed counts 0 bytes."""
    spec = s.get("spec") or {}
    if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER \
            or not spec.get("nodeName"):
        return None
    node = str(spec["nodeName"])
    pool = str((spec.get("pool") or {}).get("name") or node)
    cards = 0
    mig: dict[tuple[str, str], int] = defaultdict(int)
    instances: dict[tuple[str, str], int] = {}
    for d in spec.get("devices") or []:
        if not isinstance(d, Mapping):
            continue
        profile = usage.instance_profile(d)
        if profile is None:
            cards += _memory(d)
            continue
        uuid = (d.get("attributes") or {}).get("uuid") or {}
        mig[(str(uuid.get("string") or "") if isinstance(uuid, Mapping) else "", profile)] \
            += _memory(d)
        if d.get("name"):
            instances[(pool, str(d["name"]))] = _memory(d)
    return SliceMemory(node, cards, dict(mig), instances)


def node_capacity(parts: Iterable[SliceMemory]) -> dict[str, int]:
    """Node -> memory bytes of its cards: every shareable card's capacity, and each
    MIG-mode card (node and card uuid) once, as :func:`hami.dra.usage.mig_card_total` of
    its instance devices across the node's slices. Every node of ``parts`` is a key."""
    cap: dict[str, int] = defaultdict(int)
    mig: dict[tuple[str, str], dict[str, int]] = {}
    for part in parts:
        cap[part.node] += part.cards_bytes
        for (uuid, profile), n in part.mig_bytes.items():
            sums = mig.setdefault((part.node, uuid), {})
            sums[profile] = sums.get(profile, 0) + n
    for (node, _), sums in mig.items():
        cap[node] += usage.mig_card_total(sums)
    return dict(cap)


def claim_results(c: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """``(pool, device, consumed memory bytes)`` of each result of our driver in the
    claim's allocation (``consumedCapacity``; 0 on a MIG instance, allocated whole)."""
    out = []
    alloc = (c.get("status") or {}).get("allocation") or {}
    for r in (alloc.get("devices") or {}).get("results") or []:
        if isinstance(r, Mapping) and r.get("driver") == DRIVER:
            used = r.get("consumedCapacity")
            out.append((str(r.get("pool")), str(r.get("device")),
                        _q(used.get(MEMORY)) if isinstance(used, Mapping) else 0))
    return out


def claim_memory(c: Mapping[str, Any], instances: Mapping[tuple[str, str], int]
                 ) -> dict[str, int]:
    """Node (pool) -> memory bytes the claim's allocation uses on our cards: each
    result's ``consumedCapacity``, plus, on a MIG instance device, the instance's memory
    (``instances``: :attr:`SliceMemory.instances` of the published slices)."""
    used: dict[str, int] = defaultdict(int)
    for pool, device, consumed in claim_results(c):
        used[pool] += consumed + instances.get((pool, device), 0)
    return dict(used)


def memory_use(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
               ) -> dict[str, tuple[int, int]]:
    """Node -> ``(used bytes, capacity bytes)`` of our cards' ``memory``: capacity by
    :func:`node_capacity`, use by :func:`claim_memory` of every allocated claim."""
    parts = [p for s in slices if (p := slice_memory(s)) is not None]
    cap = node_capacity(parts)
    instances: dict[tuple[str, str], int] = {}
    for part in parts:
        instances.update(part.instances)
    used: dict[str, int] = defaultdict(int)
    for c in claims:
        for node, n in claim_memory(c, instances).items():
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
