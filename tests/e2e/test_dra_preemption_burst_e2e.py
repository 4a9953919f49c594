"""DRA-mode preemption under a burst, on the real control plane (the bed of
``test_dra_preemption_e2e``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler with hami as its ``prioritize`` extender, a real ``hami scheduler
--dra-mode`` process running the preemption loop; ResourceSlices published from a fake
inventory of 15360 MiB cards, no kubelet).

20 high-priority pods arrive at once over a full cluster: together they evict no more
than they need, and no card is ever booked twice. In DRA mode a card is booked by the
allocation results of ResourceClaims (kube-scheduler writes them; each result's
``consumedCapacity`` says what it takes of the device's ``memory``, ``cores`` and
``shares``), so "booked twice" means the allocated claims of one device together
consuming more than its capacity. That is checked on the final state and on snapshots
of every claim taken all along the burst (a list is one consistent read).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from hami.dra.slices import DRIVER

from . import test_dra_preemption_e2e as base
from .test_dra_preemption_e2e import (
    HIGH,
    LOW,
    NS,
    create_pod,
    get,
    make_nodes,
    mark_running,
    wait_placed,
)

pytestmark = pytest.mark.e2e

# the same bed (its own control plane for this module) and per-test node group
bed = base.bed
group = base.group

Device = tuple[str, str]


def _q(value: Any) -> int:
    from hami.core.quantity import to_int_exact
    from hami.core.request import quantity

    return int(to_int_exact(quantity(value)) or 0)


def capacities(client: Any, nodes: list[str]) -> dict[Device, dict[str, int]]:
    """``(pool, device)`` -> capacity (``memory`` bytes, ``cores``, ``shares``) of every
    device of our ResourceSlices on ``nodes``, as published."""
    from lightkube.resources.resource_v1 import ResourceSlice

    out: dict[Device, dict[str, int]] = {}
    for s in client.list(ResourceSlice):
        spec = s.to_dict()["spec"]
        if spec.get("driver") != DRIVER or spec.get("nodeName") not in nodes:
            continue
        for dev in spec.get("devices") or []:
            out[(spec["pool"]["name"], dev["name"])] = {
                k: _q(v["value"]) for k, v in (dev.get("capacity") or {}).items()}
    return out


def booked(client: Any) -> tuple[dict[Device, dict[str, int]], dict[Device, int]]:
    """What the allocated claims in ``NS`` consume per ``(pool, device)`` (summed
    ``consumedCapacity``), and how many claims hold each device."""
    from lightkube.resources.resource_v1 import ResourceClaim

    used: dict[Device, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    holders: dict[Device, int] = defaultdict(int)
    for claim in client.list(ResourceClaim, namespace=NS):
        alloc = ((claim.to_dict().get("status") or {}).get("allocation") or {})
        for r in (alloc.get("devices") or {}).get("results") or []:
            if r.get("driver") != DRIVER:
                continue
            device = (r["pool"], r["device"])
            holders[device] += 1
            for key, value in (r.get("consumedCapacity") or {}).items():
                used[device][key] += _q(value)
    return used, holders


def overbooked(used: dict[Device, dict[str, int]], caps: dict[Device, dict[str, int]]
               ) -> list[str]:
    """Each device of ``caps`` whose booked ``memory``, ``cores`` or ``shares`` exceed it."""
    return [f"{dev} {key}: {used[dev][key]} > {cap[key]}"
            for dev, cap in caps.items() if dev in used
            for key in ("memory", "cores", "shares") if used[dev].get(key, 0) > cap[key]]


class Sampler(threading.Thread):
    """Reads every claim again and again, with its own client, until stopped; keeps each
    overbooking it sees and how many snapshots it took."""

    def __init__(self, client: Any, caps: dict[Device, dict[str, int]]) -> None:
        super().__init__(daemon=True)
        self.client, self.caps = client, caps
        self.stop = threading.Event()
        self.samples = 0
        self.seen: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                used, _ = booked(self.client)
            except Exception as exc:  # noqa: BLE001 - reported by the test, not lost
                self.errors.append(repr(exc))
                continue
            self.samples += 1
            self.seen.extend(overbooked(used, self.caps))


def test_20_preemptors_at_once_evict_no_more_than_needed(bed: dict[str, Any],
                                                         group: str) -> None:
    """3 nodes of two 15360 MiB cards, each card full with two low-priority 7000 MiB pods
    (1360 MiB free); 20 high-priority 3000 MiB pods arrive at once. A card with one victim
    gone holds two of them, an emptied card five: at least 8 evictions are needed (four
    emptied cards). hami starts a preemption only when no room already freed, or being
    freed, fits the pod, so before each eviction every place for a 3000 MiB pod is held
    by another preemptor (19 at most); 9 evictions free at least 21 places (a card's
    first victim frees 2, its second 3 more), so a 10th is never needed. Every eviction
    must leave room that a preemptor uses, and no card is ever booked over its memory,
    cores or slots."""
    client = bed["client"]
    nodes = {f"burst{i}": 2 for i in range(3)}
    names = make_nodes(bed, group, nodes)
    caps = capacities(client, names)
    assert len(caps) == 6, caps
    # one at a time: created together, kube-scheduler may find a card full while
    # another's allocation is in flight, and leave the pod unschedulable for minutes
    low = {}
    for node in names:
        for k in range(4):
            name = create_pod(bed, group, f"lo-{node}-{k}", node, LOW, memory_mib=7000)
            low[name] = wait_placed(bed, name)
    low_names = list(low)
    for n in low_names:
        mark_running(bed, n)
    per_card: dict[Device, int] = defaultdict(int)
    for _, device in low.values():
        per_card[device] += 1
    assert sorted(per_card.values()) == [2] * 6, per_card  # every card full

    sampler = Sampler(bed["cp"].client(), caps)
    sampler.start()
    began = time.monotonic()
    try:
        high = [f"hi-{group}-{i:02d}" for i in range(20)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: create_pod(bed, group, n, "", HIGH, memory_mib=3000),
                          high))
        bound = {n: wait_placed(bed, n, timeout_s=240) for n in high}
    finally:
        sampler.stop.set()
        sampler.join(timeout=30)
    gone = [n for n in low if get(bed, n) is None]
    print(f"DRA mode, 20 preemptors over 6 full cards: {len(gone)} evictions "
          f"(8 needed at least), all bound in {time.monotonic() - began:.1f} s; "
          f"{sampler.samples} snapshots of the claims")
    assert 8 <= len(gone) <= 9, gone
    used_devices = {device for _, device in bound.values()}
    for victim in gone:  # every eviction made room that a preemptor took
        assert low[victim][1] in used_devices, (victim, low[victim][1])
    # nobody of the preemptors' priority was evicted, nor the survivors touched
    for name, (before, _) in low.items():
        if name in gone:
            continue
        now = get(bed, name)
        assert now is not None and now["metadata"]["uid"] == before["metadata"]["uid"]
        assert not now["metadata"].get("deletionTimestamp")
    for name, (before, _) in bound.items():
        now = get(bed, name)
        assert now is not None and now["metadata"]["uid"] == before["metadata"]["uid"]
    used, holders = booked(client)
    assert overbooked(used, caps) == []
    assert sum(holders.values()) == len(low) - len(gone) + len(bound)
    assert not sampler.errors, sampler.errors[:3]
    assert sampler.samples >= 3, sampler.samples
    assert sampler.seen == [], sampler.seen[:5]
