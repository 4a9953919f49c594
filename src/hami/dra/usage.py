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
from dataclasses import dataclass
from typing import Any

from hami.core.podobjects import mapping_or_empty
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity
from hami.dra.slices import CORES, DRIVER, MEMORY, MIB, SHARES, UNHEALTHY_TAINT

#: ``mode`` of a DRA card in the view (extender-mode cards carry their device mode).
MODE_DRA = "dra"
#: ``mode`` of a MIG-mode card published as instance devices.
MODE_DRA_MIG = "dra-mig"


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


def instance_profile(dev: Mapping[str, Any]) -> str | None:
    """The ``profile`` attribute of a MIG instance device (:mod:`hami.dra.migslices`) as
    a string; None for a shareable card (no ``profile``). Every reader of our slices
    (``hami top``, the metrics, ``/prioritize``, the webhook) tells the two apart by it."""
    profile = _attr(dev, "profile")
    return None if profile is None else str(profile)


def mig_card_total(per_profile: Mapping[str, int]) -> int:
    """A MIG-mode card's memory, from its published instance devices (the slices carry
    no memory capacity for the card itself): ``per_profile`` maps each profile to the
    summed memory of the card's instances of that profile (any unit; the answer is in
    the same); the card counts the most of those, the memory all instances of one
    profile hold together (the card's memory as MIG can use it). 0 without instances."""
    return max(per_profile.values(), default=0)


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
    refs = mapping_or_empty(claim.get("status")).get("reservedFor")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and ref.get("name"):
            out.append(str(ref["name"]))
    return out


@dataclass(frozen=True, slots=True)
class _Charge:
    """One allocation result on a published card: the claim's namespace and name, the
    pods reserving it, the card's node and view, what it consumes."""

    namespace: str
    claim: str
    users: tuple[str, ...]
    node: str
    card: dict[str, Any]
    memory_mib: int
    cores: int
    shares: int
    profile: str = ""
    instance: str = ""


def _mig_card(dev: Mapping[str, Any]) -> dict[str, Any]:
    """The view of a MIG-mode card from one of its instance devices: mode
    :data:`MODE_DRA_MIG`, no cores, memory and tasks totals filled in by :func:`_join`."""
    card = _card(dev)
    card["mode"] = MODE_DRA_MIG
    card["memory_mib"]["total"] = card["cores"]["total"] = card["tasks"]["total"] = 0
    card["instances"] = 0
    return card


def _join(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
          ) -> tuple[dict[str, list[dict[str, Any]]], list[_Charge], set[int]]:
    """Cards per node (in slice order, usage not yet summed), the allocation results on
    them, and the ``id()`` of the MIG-mode cards. The instance devices of a MIG-mode card
    (a ``profile`` attribute; :mod:`hami.dra.migslices`) make one card, keyed by node and
    card UUID: its memory total is :func:`mig_card_total` of its instances, its tasks
    total the most instances of one profile; a result on an instance counts the instance's
    memory (it has no ``consumedCapacity``: it is allocated whole) and names its
    profile."""
    cards: dict[tuple[str, str], tuple[str, dict[str, Any], str, int]] = {}
    order: dict[str, list[dict[str, Any]]] = {}
    mig: dict[tuple[str, str], dict[str, Any]] = {}
    per_profile: dict[tuple[int, str], int] = {}
    mib_per_profile: dict[int, dict[str, int]] = {}
    for s in slices:
        spec = (s.get("spec") or {}) if isinstance(s, Mapping) else {}
        if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER \
                or not spec.get("nodeName"):
            continue
        node_name = str(spec["nodeName"])
        pool = str((spec.get("pool") or {}).get("name") or node_name)
        for dev in spec.get("devices") or []:
            if not isinstance(dev, Mapping) or not dev.get("name"):
                continue
            profile = instance_profile(dev)
            if profile is None:
                card = _card(dev)
                cards[(pool, str(dev["name"]))] = (node_name, card, "", 0)
                order.setdefault(node_name, []).append(card)
                continue
            key = (node_name, str(_attr(dev, "uuid") or ""))
            card = mig.get(key) or _mig_card(dev)
            if key not in mig:
                mig[key] = card
                order.setdefault(node_name, []).append(card)
            memory_mib = _card(dev)["memory_mib"]["total"]
            card["instances"] += 1
            count = per_profile[(id(card), profile)] = per_profile.get((id(card), profile), 0) + 1
            card["tasks"]["total"] = max(card["tasks"]["total"], count)
            sums = mib_per_profile.setdefault(id(card), {})
            sums[profile] = sums.get(profile, 0) + memory_mib
            card["memory_mib"]["total"] = mig_card_total(sums)
            cards[(pool, str(dev["name"]))] = (node_name, card, profile, memory_mib)
    charges = []
    for c in claims:
        if not isinstance(c, Mapping):
            continue
        meta, status = mapping_or_empty(c.get("metadata")), mapping_or_empty(c.get("status"))
        ns, claim_name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        users = tuple(_users(c))
        alloc = mapping_or_empty(status.get("allocation"))
        results = mapping_or_empty(alloc.get("devices")).get("results")
        for r in results if isinstance(results, list) else []:
            if not isinstance(r, Mapping) or r.get("driver") != DRIVER:
                continue
            found = cards.get((str(r.get("pool")), str(r.get("device"))))
            if found is None:
                continue
            node_name, card, profile, instance_mib = found
            used = r.get("consumedCapacity") or {}
            if not isinstance(used, Mapping):
                used = {}
            if profile:
                charges.append(_Charge(ns, claim_name, users, node_name, card, instance_mib,
                                       0, 1, profile, str(r.get("device"))))
                continue
            charges.append(_Charge(ns, claim_name, users, node_name, card,
                                   _q(used.get(MEMORY)) // MIB, _q(used.get(CORES)),
                                   _q(used.get(SHARES))))
    return order, charges, {id(card) for card in mig.values()}


def dra_nodes(slices: Iterable[Mapping[str, Any]],
              claims: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The nodes with a ResourceSlice of our driver, sorted by name, each
    ``{"name", "mode": "dra", "gpus", "memory_mib", "cores", "tasks" ({"used", "total"}),
    "pods" (distinct pods), "lock": "", "devices"}``; a device's ``pods`` lists one entry
    per allocation result on it: ``{"namespace", "name"`` (the pods that reserve the claim,
    joined with ``,``; the claim's name while none does), ``"claim", "memory_mib",
    "cores", "slots"}``. Results on a device no slice publishes are left out.

    A MIG-mode card is one device (mode :data:`MODE_DRA_MIG`, ``"instances"``: how many
    instance devices it publishes), not one per instance device: its memory total is the
    most instances of one profile hold together (the card's memory as MIG can use it),
    its tasks total the most instances of one profile, and each
    instance allocated on it is a ``pods`` entry with the instance's memory, ``cores`` 0,
    ``slots`` 1 and ``"profile"``, ``"instance"`` (the device name)."""
    order, charges, _ = _join(slices, claims)
    pods_on: dict[str, set[tuple[str, str]]] = {}
    for ch in charges:
        card = ch.card
        card["memory_mib"]["used"] += ch.memory_mib
        card["cores"]["used"] += ch.cores
        card["tasks"]["used"] += ch.shares
        entry = {"namespace": ch.namespace, "name": ",".join(ch.users) or ch.claim,
                 "claim": ch.claim, "memory_mib": ch.memory_mib, "cores": ch.cores,
                 "slots": ch.shares}
        if ch.profile:
            entry.update(profile=ch.profile, instance=ch.instance)
        card["pods"].append(entry)
        pods_on.setdefault(ch.node, set()).update((ch.namespace, u) for u in ch.users)
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


@dataclass(frozen=True, slots=True)
class CardUse:
    """One published card and what DRA claims hold of it (the scheduler's per-GPU
    metrics): ``memory_mib``/``cores_percent`` its ``memory``/``cores`` capacity,
    ``tasks`` the allocation results on it, ``memory_used_mib``/``cores_used_percent``
    the sums of their ``consumedCapacity``."""

    node: str
    uuid: str
    index: int
    type: str
    memory_mib: int
    cores_percent: int
    tasks: int
    memory_used_mib: int
    cores_used_percent: int


@dataclass(frozen=True, slots=True)
class PodUse:
    """What one pod's claims hold of one card (the scheduler's per-pod metrics): the
    sums over the claims whose ``status.reservedFor`` names the pod."""

    namespace: str
    node: str
    pod: str
    device_uuid: str
    memory_mib: int
    cores_percent: int


def metric_rows(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
                ) -> tuple[list[CardUse], list[PodUse]]:
    """The DRA allocations in the shape of the scheduler's extender-mode metrics.

    Cards: every whole card of our ResourceSlices, by node then index. MIG instance
    devices (partitionable devices with a ``profile`` attribute) are left out: the card
    they carve has no ``memory``/``cores`` capacity of its own in the slice.
    Pods: one row per (namespace, node, pod, card), summing the results of every claim
    the pod reserves on that card; a claim shared by several pods counts in full for
    each of them (each may use all of it), a claim no pod reserves yet for none.
    """
    order, charges, mig = _join(slices, claims)
    tasks: dict[int, list[_Charge]] = {}
    pods: dict[tuple[str, str, str, str], list[int]] = {}
    for ch in charges:
        if id(ch.card) in mig:
            continue
        tasks.setdefault(id(ch.card), []).append(ch)
        for user in dict.fromkeys(ch.users):
            sums = pods.setdefault((ch.namespace, ch.node, user, ch.card["uuid"]), [0, 0])
            sums[0] += ch.memory_mib
            sums[1] += ch.cores
    cards = []
    for node in sorted(order):
        for card in sorted(order[node], key=lambda d: d["index"]):
            if id(card) in mig:
                continue
            on = tasks.get(id(card), [])
            cards.append(CardUse(node, card["uuid"], card["index"], card["type"],
                                 card["memory_mib"]["total"], card["cores"]["total"], len(on),
                                 sum(c.memory_mib for c in on), sum(c.cores for c in on)))
    return cards, [PodUse(*key, mem, cores) for key, (mem, cores) in sorted(pods.items())]
