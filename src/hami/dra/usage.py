"""What DRA mode has allocated, per card, for ``hami top``. Pure.

In DRA mode no node annotation or pod annotation records an allocation: kube-scheduler
writes it into each ResourceClaim's ``status.allocation.devices.results[]`` (``pool`` =
the node, ``device`` = ``gpu-<index>``, ``consumedCapacity``), and the claim's
``status.reservedFor`` names the pods that use it. :func:`dra_nodes` joins those results
to the cards of our ResourceSlices (:mod:`hami.dra.slices`) and gives each node in the
shape ``hami top`` shows for extender-mode nodes: per card the capacity, the sums of
``memory`` (MiB), ``cores`` (%) and ``shares`` consumed, and the claims with their pods.

Objects are what the API server returns (dicts); anything malformed counts as nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB, SHARES, UNHEALTHY_TAINT

#: ``mode`` of a DRA card in the view (extender-mode cards carry their device mode).
MODE_DRA = "dra"


def _q(raw: Any) -> int:
    try:
        return int(to_int_exact(quantity(raw)) or 0)
    except (QuantityError, ValueError, TypeError):
        return 0


def _attr(dev: Mapping[str, Any], name: str) -> Any:
    value = (dev.get("attributes") or {}).get(name) or {}
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _card(dev: Mapping[str, Any]) -> dict[str, Any]:
    cap = dev.get("capacity") or {}

    def total(name: str) -> int:
        entry = cap.get(name) if isinstance(cap, Mapping) else None
        return _q(entry.get("value")) if isinstance(entry, Mapping) else 0

    taints = [t for t in dev.get("taints") or [] if isinstance(t, Mapping)]
    ours = [str(t.get("value") or "") for t in taints if t.get("key") == UNHEALTHY_TAINT]
    index = _attr(dev, "index")
    numa = _attr(dev, "numa")
    return {
        "index": index if isinstance(index, int) else -1,
        "uuid": str(_attr(dev, "uuid") or ""), "type": str(_attr(dev, "type") or ""),
        "mode": MODE_DRA, "numa": numa if isinstance(numa, int) else 0,
        "health": "unhealthy" not in ours, "cordoned": "cordoned" in ours,
        "memory_mib": {"used": 0, "total": total(MEMORY) // MIB},
        "cores": {"used": 0, "total": total(CORES)},
        "tasks": {"used": 0, "total": total(SHARES)},
        "pods": [],
    }


def _users(claim: Mapping[str, Any]) -> list[str]:
    """Names of the pods in the claim's ``status.reservedFor``."""
    out = []
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and ref.get("name"):
            out.append(str(ref["name"]))
    return out


def dra_nodes(slices: Iterable[Mapping[str, Any]],
              claims: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The nodes with a ResourceSlice of our driver, sorted by name, each
    ``{"name", "mode": "dra", "gpus", "memory_mib", "cores", "tasks" ({"used", "total"}),
    "pods" (distinct pods), "lock": "", "devices"}``; a device's ``pods`` lists one entry
    per allocation result on it: ``{"namespace", "name"`` (the pods that reserve the claim,
    joined with ``,``; the claim's name while none does), ``"claim", "memory_mib",
    "cores", "slots"}``. Results on a device no slice publishes are left out."""
    cards: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    order: dict[str, list[dict[str, Any]]] = {}
    for s in slices:
        spec = (s.get("spec") or {}) if isinstance(s, Mapping) else {}
        if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER \
                or not spec.get("nodeName"):
            continue
        node_name = str(spec["nodeName"])
        pool = str((spec.get("pool") or {}).get("name") or node_name)
        for dev in spec.get("devices") or []:
            if isinstance(dev, Mapping) and dev.get("name"):
                card = _card(dev)
                cards[(pool, str(dev["name"]))] = (node_name, card)
                order.setdefault(node_name, []).append(card)
    pods_on: dict[str, set[tuple[str, str]]] = {}
    for c in claims:
        if not isinstance(c, Mapping):
            continue
        meta = c.get("metadata") or {}
        ns, claim_name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        users = _users(c)
        alloc = (c.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            if not isinstance(r, Mapping) or r.get("driver") != DRIVER:
                continue
            found = cards.get((str(r.get("pool")), str(r.get("device"))))
            if found is None:
                continue
            node, card = found
            used = r.get("consumedCapacity") or {}
            mem = _q(used.get(MEMORY)) // MIB if isinstance(used, Mapping) else 0
            cores = _q(used.get(CORES)) if isinstance(used, Mapping) else 0
            shares = _q(used.get(SHARES)) if isinstance(used, Mapping) else 0
            card["memory_mib"]["used"] += mem
            card["cores"]["used"] += cores
            card["tasks"]["used"] += shares
            card["pods"].append({"namespace": ns, "name": ",".join(users) or claim_name,
                                 "claim": claim_name, "memory_mib": mem, "cores": cores,
                                 "slots": shares})
            pods_on.setdefault(node, set()).update((ns, u) for u in users)
    out = []
    for node in sorted(order):
        devices = sorted(order[node], key=lambda d: d["index"])
        for d in devices:
            d["pods"].sort(key=lambda p: (p["namespace"], p["name"], p["claim"]))
        out.append({
            "name": node, "mode": MODE_DRA, "gpus": len(devices),
            **{k: {"used": sum(d[k]["used"] for d in devices),
                   "total": sum(d[k]["total"] for d in devices)}
               for k in ("memory_mib", "cores", "tasks")},
            "pods": len(pods_on.get(node, ())), "lock": "", "devices": devices,
        })
    return out
