"""Cost of one DRA ``fragmentation-aware`` ``/prioritize`` scoring in process (no API
server): ``--nodes`` nodes of 4 cards published, ``--claims`` allocated claims, every
call scoring every node; the median of ``--calls`` calls when nothing changed since the
last call, when one claim changed (per-claim incremental state,
:mod:`hami.dra.fragstate`), and when everything is recomputed (a fresh state per call:
the cost before the incremental state).

Usage::

    PYTHONPATH=src python bench/bench_dra_fragstate.py --nodes 100 1000 --claims 2000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any


def _bed(nodes: int, claims: int) -> tuple[list[str], list[dict[str, Any]], dict[str, Any]]:
    from hami.deviceplugin.config import PluginConfig
    from hami.deviceplugin.discovery import PhysicalGpu
    from hami.deviceplugin.register import node_devices
    from hami.dra.slices import resource_slice
    from hami.dra.translate import claim_spec

    names = [f"n{i:04d}" for i in range(nodes)]
    slices = [resource_slice(n, node_devices(
        [PhysicalGpu(f"GPU-{n}-{i}", i, "Tesla T4", 24576 * 2**20) for i in range(4)],
        PluginConfig(device_split_count=10))) for n in names]
    rng = random.Random(1)
    store = {}
    for k in range(claims):
        mib = rng.choice((1000, 2000, 3000, 4000))
        node = rng.choice(names)
        store[f"c{k}"] = {
            "metadata": {"namespace": "ns", "name": f"c{k}", "ownerReferences": [
                {"kind": "Pod", "name": f"p{k}", "uid": f"uid-{k}"}]},
            "spec": claim_spec(1, mib, 0, []),
            "status": {"allocation": {"devices": {"results": [
                {"driver": "gpu.hami.io", "pool": node, "device": f"gpu-{rng.randint(0, 3)}",
                 "request": "gpu", "consumedCapacity": {"memory": f"{mib}Mi", "cores": "0",
                                                        "shares": "1"}}]}}}}
    return names, slices, store


def measure(nodes: int, claims: int, calls: int) -> dict[str, Any]:
    """The three medians (ms) for one bed."""
    from hami.dra.fragscore import DraFragmentation
    from hami.dra.fragstate import FragState

    names, slices, store = _bed(nodes, claims)
    pod = {"metadata": {"namespace": "ns", "name": "p0", "uid": "uid-0"},
           "status": {"resourceClaimStatuses": [{"name": "gpu-0", "resourceClaimName": "c0"}]}}
    frag = DraFragmentation()
    version = 0
    frag(pod, names, slices, list(store.values()), version)  # warm: learn, first state
    out: dict[str, list[float]] = {"unchanged": [], "one_claim_changed": [],
                                   "full_recompute": []}
    rng = random.Random(2)
    for _ in range(calls):
        t = time.perf_counter()
        frag(pod, names, slices, list(store.values()), version)
        out["unchanged"].append(time.perf_counter() - t)
        key = f"c{rng.randint(1, claims - 1)}"
        store[key] = {**store[key]}  # the watch cache replaces a changed object's dict
        version += 1
        t = time.perf_counter()
        frag(pod, names, slices, list(store.values()), version)
        out["one_claim_changed"].append(time.perf_counter() - t)
        frag._state = FragState()
        version += 1
        t = time.perf_counter()
        frag(pod, names, slices, list(store.values()), version)
        out["full_recompute"].append(time.perf_counter() - t)
    return {"nodes": nodes, "claims": claims,
            **{f"{k}_ms": round(1000 * statistics.median(v), 2) for k, v in out.items()}}


def main() -> None:
    """Print one JSON row per node count."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--claims", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    for n in args.nodes:
        print(json.dumps(measure(n, args.claims, args.calls)))


if __name__ == "__main__":
    main()
