"""Cost of DRA mode's ``fragmentation-aware`` ``/prioritize`` score, in process.

A cluster of ``--nodes`` nodes with 4 cards of 16 GiB split 10 (our ResourceSlices, as
the node agent publishes them) and ``--claims`` allocated ResourceClaims of random
shapes (1-2 cards' share, one or two cards) spread over them. The scorer
(:class:`hami.dra.fragscore.DraFragmentation`) is called as ``/prioritize`` calls it
with the watch cache's objects and version:

* ``unchanged``: the same objects and version as the call before;
* ``changed``: one claim was allocated (a new claim object, a new version) and its pod
  bound (a Pod event with its CPU and memory) since the call before, as after each pod
  kube-scheduler binds.

Each node has 64 cores and 512 GiB (its Node object) and each claim's pod requests 4
cores and 16 GiB (:class:`hami.dra.hosts.HostUsage`, fed as the scheduler's watches
feed it; ``--lists`` leaves it out, as code before it cannot take it).

The objects are passed as the watch cache's dicts by ``(namespace, name)``, as
``/prioritize`` passes them (``--lists``: as lists, as it did before). The pod being
scored asks a quarter card. Medians and p99 over ``--calls`` calls of
each kind, after ``--warm`` warm-up calls (the mix learned, the state built).

Usage::

    PYTHONPATH=src python bench/bench_dra_prioritize.py [--nodes 1000] [--claims 2000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

CARDS, CARD_MIB, SPLIT = 4, 16384, 10


def _slice(node: str) -> dict[str, Any]:
    from hami.deviceplugin.config import PluginConfig
    from hami.deviceplugin.discovery import PhysicalGpu
    from hami.deviceplugin.register import node_devices
    from hami.dra.slices import resource_slice

    gpus = [PhysicalGpu(f"GPU-{node}-{i}", i, "Tesla T4", CARD_MIB * 2**20)
            for i in range(CARDS)]
    return resource_slice(node, node_devices(gpus, PluginConfig(device_split_count=SPLIT)))


def _claim(name: str, mib: int, nums: int, node: str | None, cards: list[int]
           ) -> dict[str, Any]:
    from hami.dra.translate import claim_spec

    claim: dict[str, Any] = {
        "metadata": {"namespace": "bench", "name": name,
                     "ownerReferences": [{"kind": "Pod", "name": name, "uid": f"uid-{name}"}]},
        "spec": claim_spec(nums, mib, 0, [])}
    if node is not None:
        used = {"memory": f"{mib}Mi", "cores": "0", "shares": "1"}
        claim["status"] = {"allocation": {"devices": {"results": [
            {"driver": "gpu.hami.io", "pool": node, "device": f"gpu-{c}", "request": "gpu",
             "consumedCapacity": used} for c in cards]}}}
    return claim


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "bench", "name": name, "uid": f"uid-{name}"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": name}]}}


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered) * 1e3, 3),
            "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e3, 3)}


def main() -> None:
    """Run the bench and print its JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--claims", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lists", action="store_true",
                    help="pass lists of the objects (as /prioritize did before the scorer "
                         "took the watch cache's dicts; needed to run this on older code)")
    args = ap.parse_args()
    from hami.dra.fragscore import DraFragmentation

    hosts = None
    if not args.lists:
        from hami.dra.hosts import HostUsage

        hosts = HostUsage({n: {"metadata": {"name": n}, "status": {"allocatable": {
            "cpu": "64", "memory": "512Gi"}}} for n in [f"node-{i:05d}"
                                                       for i in range(args.nodes)]})
    rng = random.Random(args.seed)
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    slices = {("", f"{n}-gpu.hami.io"): _slice(n) for n in names}
    used = {n: [0] * CARDS for n in names}
    claims: dict[tuple[str, str], dict[str, Any]] = {}

    def allocate(name: str) -> None:
        nums = 2 if rng.random() < 0.1 else 1
        mib = rng.choice((2048, 4096, 8192, 12288, CARD_MIB)) if nums == 1 else CARD_MIB
        for _ in range(50):
            node = rng.choice(names)
            cards = [c for c in range(CARDS) if used[node][c] + mib <= CARD_MIB][:nums]
            if len(cards) == nums:
                for c in cards:
                    used[node][c] += mib
                claims[("bench", name)] = _claim(name, mib, nums, node, cards)
                if hosts is not None:
                    pod = _pod(name)
                    pod["spec"]["nodeName"] = node
                    pod["spec"]["containers"] = [{"name": "c", "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi"}}}]
                    hosts.observe_pod(pod, False)
                return

    for k in range(args.claims):
        allocate(f"c{k}")
    frag = DraFragmentation() if hosts is None else DraFragmentation(hosts=hosts)
    version = 0

    def call(pod: str) -> float:
        claims.setdefault(("bench", pod), _claim(pod, 4096, 1, None, []))
        start = time.perf_counter()
        if args.lists:
            frag(_pod(pod), names, list(slices.values()), list(claims.values()), version)
        else:
            frag(_pod(pod), names, slices, claims, version)
        return time.perf_counter() - start

    for k in range(args.warm):
        version += 1
        call(f"warm{k}")
    unchanged, changed = [], []
    for k in range(args.calls):
        version += 1
        allocate(f"new{k}")
        changed.append(call(f"p{k}"))
        unchanged.append(call(f"p{k}"))
    print(json.dumps({"nodes": args.nodes, "claims": len(claims), "calls": args.calls,
                      "unchanged": _summary(unchanged), "changed": _summary(changed)}))


if __name__ == "__main__":
    main()
