"""Device-level policy in DRA mode by publish order: does it work, and what does it cost?

kube-scheduler's DRA allocator takes, inside a node, the first device of the slice that
fits (:func:`order_cards`). This bench republishes each node's slice with its
cards in a GPU policy's order (:func:`order_cards`: ``spread``
least used first, ``binpack`` most used first) every time the claims allocated on the
node change, and compares the per-card spread reached with ``index`` (today: the slice
in index order, never reordered).

Real control plane (etcd, kube-apiserver, the default kube-scheduler, which allocates
the claims, kube-controller-manager with the resourceclaim controller); the nodes
publish 4 cards of 16 GiB split 10. The republisher is the best case of a node agent:
it follows every ResourceClaim through one watch (a real agent would have to watch every
claim of the cluster for its node's, or learn them only when the kubelet prepares them,
later) and writes the slice with :class:`hami.dra.node.SlicePublisher` (one replace, a
new pool generation, per change). Pods ask 1000-2500 MiB of one card; ``burst`` creates
them all at once, ``paced`` one every ``--gap`` seconds.

Usage::

    PYTHONPATH=src python bench/bench_dra_order.py [--nodes 2] [--pods 16] [--gap 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

GPUS, CARD_MIB, SPLIT = 4, 16384, 10


def _cards(name: str) -> list[Any]:
    from hami.core.model import DeviceInfo

    return [DeviceInfo(uuid=f"GPU-{name}-{g}", index=g, split_count=SPLIT,
                       memory_mib=CARD_MIB, cores_percent=100, type="NVIDIA-Tesla T4",
                       numa=0, mode="hami-core", health=True) for g in range(GPUS)]


#: The orders :func:`order_cards` knows: ``index`` (today's), ``spread`` (least used
#: card first), ``binpack`` (most used card first).
ORDERS = ("index", "spread", "binpack")


def order_cards(devices: list[Any], used_mib: dict[str, int],
                order: str) -> list[Any]:
    """``devices`` in the order to publish them. ``used_mib``: card UUID -> memory (MiB)
    the claims allocated on it consume (missing: 0). The key is the used share of the
    card's memory, ties by index; ``index`` keeps the input order.

    Raises:
        ValueError: ``order`` is not one of :data:`ORDERS`.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown device order {order!r}; valid: {', '.join(ORDERS)}")
    if order == "index":
        return list(devices)
    sign = 1 if order == "spread" else -1

    def key(d: Any) -> tuple[float, int]:
        share = used_mib.get(d.uuid, 0) / d.memory_mib if d.memory_mib > 0 else 1.0
        return sign * share, d.index

    return sorted(devices, key=key)


class Republisher:
    """Follows every ResourceClaim and republishes the run's nodes' slices in ``order``
    whenever the memory allocated on one of their cards changes; counts the writes."""

    def __init__(self, cp: Any, nodes: list[str], order: str) -> None:
        from hami.dra.node import SlicePublisher

        self.client = cp.client()
        self.nodes, self.order = nodes, order
        self.publishers = {n: SlicePublisher(self.client, n) for n in nodes}
        self.writes = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def used(self, claims: dict[str, dict[str, Any]]) -> dict[str, int]:
        from hami.dra.policy import _q

        out: dict[str, int] = defaultdict(int)
        for c in claims.values():
            alloc = (c.get("status") or {}).get("allocation") or {}
            for r in (alloc.get("devices") or {}).get("results") or []:
                uuid = f"GPU-{r['pool']}-{r['device'].removeprefix('gpu-')}"
                out[uuid] += _q((r.get("consumedCapacity") or {}).get("memory")) // 2**20
        return out

    def run(self) -> None:
        claims: dict[str, dict[str, Any]] = {}
        last: dict[str, list[str]] = {}
        try:
            self._follow(claims, last)
        except Exception:  # noqa: BLE001 - the control plane stops under the watch
            if not self.stop.is_set():
                raise

    def _follow(self, claims: dict[str, dict[str, Any]], last: dict[str, list[str]]) -> None:
        from lightkube.resources.resource_v1 import ResourceClaim

        for event, obj in self.client.watch(ResourceClaim, namespace="*"):
            if self.stop.is_set():
                return
            doc = obj.to_dict()
            key = f"{doc['metadata'].get('namespace')}/{doc['metadata']['name']}"
            if event == "DELETED":
                claims.pop(key, None)
            else:
                claims[key] = doc
            used = self.used(claims)
            for node in self.nodes:
                cards = order_cards(_cards(node), used, self.order)
                names = [c.uuid for c in cards]
                if last.get(node) != names and self.publishers[node].sync(cards):
                    self.writes += 1
                last[node] = names


def one_run(cp: Any, order: str, pattern: str, n_nodes: int, pods: int,
            gap_s: float) -> dict[str, Any]:
    """One order x pattern on its own nodes (labelled ``bench-run``); the result row."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod
    from lightkube.resources.resource_v1 import ResourceClaim

    from hami.devices.nvidia import NvidiaConfig
    from hami.dra.node import SlicePublisher
    from hami.dra.policy import _q
    from hami.dra.translate import translate
    from hami.testing.controlplane import create_gpu_node, ensure_namespace

    run = f"{order}-{pattern}"
    client = cp.client()
    ensure_namespace(client, run)
    nodes = [f"{run}-{i}" for i in range(n_nodes)]
    for name in nodes:
        create_gpu_node(client, name, gpus=0, labels={"bench-run": run})
        SlicePublisher(client, name).sync(_cards(name))
    rep = Republisher(cp, nodes, order) if order != "index" else None
    if rep is not None:
        rep.thread.start()
        time.sleep(1.0)
    templates: dict[str, Any] = {}
    objs = []
    for i in range(pods):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"p{i:03d}", "namespace": run},
               "spec": {"nodeSelector": {"bench-run": run},
                        "containers": [{"name": "c", "image": "pause", "resources": {
                            "limits": {"nvidia.com/gpu": 1,
                                       "nvidia.com/gpumem": 1000 + (i % 4) * 500}}}]}}
        result = translate(pod, NvidiaConfig())
        assert result is not None
        templates.update(result.templates)
        objs.append(codecs.from_dict(result.pod))
    for tmpl in templates.values():
        client.create(codecs.from_dict(tmpl), namespace=run)
    t0 = time.monotonic()
    if pattern == "burst":
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(client.create, objs))
    else:
        for obj in objs:
            client.create(obj)
            time.sleep(gap_s)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        bound = [p for p in client.list(Pod, namespace=run) if p.spec.nodeName]
        if len(bound) == pods:
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    time.sleep(2.0)  # the last republish lands
    per_card: dict[str, int] = {f"GPU-{n}-{g}": 0 for n in nodes for g in range(GPUS)}
    for c in client.list(ResourceClaim, namespace=run):
        for r in (c.to_dict().get("status") or {}).get("allocation", {}).get(
                "devices", {}).get("results") or []:
            per_card[f"GPU-{r['pool']}-{r['device'].removeprefix('gpu-')}"] += \
                _q(r["consumedCapacity"]["memory"]) // 2**20
    if rep is not None:
        rep.stop.set()
    gaps, busiest, spreads = [], [], []
    for n in nodes:
        used = [per_card[f"GPU-{n}-{g}"] for g in range(GPUS)]
        gaps.append(max(used) - min(used))
        busiest.append(max(used))
        spreads.append(statistics.pstdev(used))
    writes = rep.writes if rep is not None else 0
    row = {"order": order, "pattern": pattern, "nodes": n_nodes, "pods": pods,
           "card_used_mib": {n: [per_card[f"GPU-{n}-{g}"] for g in range(GPUS)] for n in nodes},
           "max_minus_min_mib_mean": round(statistics.mean(gaps)),
           "card_stdev_mib_mean": round(statistics.mean(spreads)),
           "cards_used": sum(1 for v in per_card.values() if v),
           "slice_writes": writes, "slice_writes_per_pod": round(writes / pods, 2),
           "seconds": round(elapsed, 1), "load_avg": os.getloadavg()[0]}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--pods", type=int, default=16)
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between paced pods")
    ap.add_argument("--orders", nargs="+", default=["index", "spread", "binpack"])
    ap.add_argument("--patterns", nargs="+", default=["paced", "burst"])
    args = ap.parse_args()
    from hami.testing.controllers import start_controller_manager
    from hami.testing.controlplane import ControlPlane
    from hami.testing.dranode import create_device_class

    work = Path(tempfile.mkdtemp(prefix="hami-bench-dra-order-"))
    with ControlPlane(workdir=work / "k8s") as cp:
        cp.start()
        start_controller_manager(cp)
        create_device_class(cp.client())
        for pattern in args.patterns:
            for order in args.orders:
                one_run(cp, order, pattern, args.nodes, args.pods, args.gap)


if __name__ == "__main__":
    main()
