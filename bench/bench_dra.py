"""Pods per second in DRA mode against extender mode, same bed, same pods, one run.

DRA mode: real control plane (etcd, kube-apiserver, the default kube-scheduler, which
allocates the claims) + kube-controller-manager with the resourceclaim controller; every
node publishes hami's ResourceSlice (4 cards of 24 GiB, split 10, as the extender bench's
nodes); each pod is what hami's DRA webhook makes of ``nvidia.com/gpu: 1`` +
``gpumem`` + ``gpucores`` (templates created once, as the webhook does). The clock runs
from the first pod creation until the last pod is seen bound (the same pod watch as
``bench_scheduler.py``). Extender mode: the
``throughput`` run of ``bench_scheduler.py`` with the same node count and pod mix.

``--prioritize``: instead, the cost of one ``/prioritize`` call (DRA mode's node policy)
on the same kind of bed without kube-scheduler: ``--nodes`` published slices and
``--claims`` ResourceClaims, every call scoring all nodes; the listing variant (every
call lists all slices and claims) against the watched one (:mod:`hami.dra.cache`).

Usage::

    PYTHONPATH=src python bench/bench_dra.py --nodes 100 --pods 500 [--no-extender]
    PYTHONPATH=src python bench/bench_dra.py --prioritize --nodes 100 1000 --claims 2000 \
        [--policy fragmentation-aware]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

GPUS, CARD_MIB, SPLIT = 4, 24576, 10


def pod_limits(i: int) -> dict[str, int]:
    """The extender bench's pod mix (bench_scheduler.throughput)."""
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000 + (i % 7) * 500}
    if (i % 3) * 10:
        limits["nvidia.com/gpucores"] = (i % 3) * 10
    return limits


def dra_throughput(n_nodes: int, pods: int) -> dict[str, Any]:
    """One DRA-mode run; returns the result row (also printed as JSON)."""
    from bench.sched_bed import BoundWatcher, plain_watch_client
    from lightkube import codecs

    from hami.core.model import DeviceInfo
    from hami.devices.nvidia import NvidiaConfig
    from hami.dra.node import SlicePublisher
    from hami.dra.slices import DRIVER
    from hami.dra.translate import translate
    from hami.testing.controllers import start_controller_manager
    from hami.testing.controlplane import ControlPlane, create_gpu_node

    work = Path(tempfile.mkdtemp(prefix="hami-bench-dra-"))
    with ControlPlane(workdir=work / "k8s") as cp:
        cp.start(default_scheduler=False)
        # the bound-time watch must not lose events (as bench_scheduler's beds)
        cp.client = lambda namespace="default", cp=cp: plain_watch_client(cp, namespace)  # type: ignore[method-assign, misc]
        start_controller_manager(cp)
        client = cp.client()
        client.create(codecs.from_dict({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}))
        t0 = time.monotonic()

        def make_node(i: int) -> None:
            name = f"node-{i:05d}"
            create_gpu_node(client, name, gpus=0)
            cards = [DeviceInfo(uuid=f"GPU-{name}-{g}", index=g, split_count=SPLIT,
                                memory_mib=CARD_MIB, cores_percent=100, type="NVIDIA-Tesla T4",
                                numa=0, mode="hami-core", health=True) for g in range(GPUS)]
            SlicePublisher(client, name).sync(cards)

        make_node(0)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make_node, range(1, n_nodes)))
        nodes_s = time.monotonic() - t0
        templates: dict[str, Any] = {}
        objs = []
        for i in range(pods):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"p{i:05d}", "namespace": "default"},
                   "spec": {"containers": [{"name": "c", "image": "pause",
                                            "resources": {"limits": pod_limits(i)}}]}}
            result = translate(pod, NvidiaConfig())
            assert result is not None
            templates.update(result.templates)
            objs.append(codecs.from_dict(result.pod))
        for tmpl in templates.values():
            client.create(codecs.from_dict(tmpl), namespace="default")
        ks = cp.start_scheduler()
        watcher = BoundWatcher(cp).start()
        time.sleep(1.0)  # the watch is open and every component idle
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(client.create, objs))
        created_s = time.monotonic() - t0
        watcher.wait(pods, timeout_s=1200)
        elapsed = max(watcher.bound_at.values()) - t0
        watcher.stop()
        ks.stop()
    row = {"mode": "dra", "nodes": n_nodes, "pods": pods,
           "pods_per_s": round(pods / elapsed, 1), "seconds": round(elapsed, 1),
           "create_seconds": round(created_s, 1), "node_setup_seconds": round(nodes_s, 1),
           "load_avg": os.getloadavg()[0]}
    print(json.dumps(row), flush=True)
    return row


def prioritize_cost(n_nodes: int, n_claims: int, calls: int = 20,
                    policy: str = "binpack") -> dict[str, Any]:
    """Milliseconds per ``/prioritize`` call, listing vs watched (median of ``calls``),
    and the API requests each makes; returns the row (also printed as JSON). With
    ``fragmentation-aware`` also ``churn_ms_per_call``: watched, but the objects changed
    since the previous call (the cards and running tasks are recomputed, as in a burst)."""
    import asyncio
    import statistics

    from lightkube import codecs

    from hami.core.model import DeviceInfo
    from hami.devices.nvidia import NvidiaConfig
    from hami.dra.cache import DraObjects
    from hami.dra.node import SlicePublisher
    from hami.dra.prioritize import DraPrioritizer
    from hami.dra.translate import translate
    from hami.testing.controlplane import ControlPlane, create_gpu_node

    work = Path(tempfile.mkdtemp(prefix="hami-bench-dra-prio-"))
    with ControlPlane(workdir=work / "k8s") as cp:
        cp.start(default_scheduler=False)
        client = cp.client()
        names = [f"node-{i:05d}" for i in range(n_nodes)]

        def make_node(name: str) -> None:
            create_gpu_node(client, name, gpus=0)
            cards = [DeviceInfo(uuid=f"GPU-{name}-{g}", index=g, split_count=SPLIT,
                                memory_mib=CARD_MIB, cores_percent=100, type="NVIDIA-Tesla T4",
                                numa=0, mode="hami-core", health=True) for g in range(GPUS)]
            SlicePublisher(client, name).sync(cards)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make_node, names))
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": "pause",
                                        "resources": {"limits": pod_limits(1)}}]}}
        result = translate(pod, NvidiaConfig())
        assert result is not None
        spec = next(iter(result.templates.values()))["spec"]["spec"]
        claims = [codecs.from_dict({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                    "metadata": {"name": f"c{i:05d}", "namespace": "default"},
                                    "spec": spec}) for i in range(n_claims)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda c: client.create(c, namespace="default"), claims))
        # the pod's claim (what fragmentation-aware reads its request from)
        pod["metadata"]["uid"] = "bench-pod"  # a pod the mix learns from
        pod["status"] = {"resourceClaimStatuses": [{"name": "gpu-0",
                                                    "resourceClaimName": "c00000"}]}
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()

        async def timed(watch: bool, churn: bool = False) -> tuple[float, list[dict[str, Any]]]:
            aclient = cp.async_client()
            try:
                prio = DraPrioritizer(aclient, policy, watch=watch)
                if watch:
                    objs = DraObjects.shared(aclient)
                    await asyncio.gather(*(e.wait() for e in objs.synced.values()))
                times, scores = [], []
                for _ in range(calls):
                    if churn:
                        DraObjects.shared(aclient).version += 1
                    t = time.perf_counter()
                    scores = await prio(body)
                    times.append((time.perf_counter() - t) * 1000)
                if watch:
                    await DraObjects.shared(aclient).stop()
                return statistics.median(times), scores
            finally:
                await aclient.close()

        listing_ms, a = asyncio.run(timed(False))
        watched_ms, b = asyncio.run(timed(True))
        assert a == b and len(a) == n_nodes
        assert policy != "fragmentation-aware" or any(r["score"] for r in a), a[:3]
        churn_ms = (asyncio.run(timed(True, churn=True))[0]
                    if policy == "fragmentation-aware" else None)
    row = {"bench": "prioritize", "policy": policy, "nodes": n_nodes, "claims": n_claims,
           **({"churn_ms_per_call": round(churn_ms, 1)} if churn_ms is not None else {}),
           "listing_ms_per_call": round(listing_ms, 1), "watched_ms_per_call": round(watched_ms, 2),
           "listing_requests_per_call": 2, "watched_requests_per_call": 0,
           "load_avg": os.getloadavg()[0]}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    """Run DRA mode (and extender mode unless ``--no-extender``) per node count."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100])
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--no-extender", action="store_true")
    ap.add_argument("--prioritize", action="store_true",
                    help="measure /prioritize per call, listing vs watched")
    ap.add_argument("--claims", type=int, default=2000)
    ap.add_argument("--policy", default="binpack",
                    help="node policy of the --prioritize run (binpack, spread, "
                         "fragmentation-aware)")
    args = ap.parse_args()
    if args.prioritize:
        print(json.dumps([prioritize_cost(n, args.claims, policy=args.policy)
                          for n in args.nodes], indent=1))
        return
    rows = []
    for n in args.nodes:
        rows.append(dra_throughput(n, args.pods))
        if not args.no_extender:
            from bench.bench_scheduler import throughput

            ext = throughput([n], args.pods, ["binpack"])[0]
            rows.append({**ext, "mode": "extender-binpack"})
            print(json.dumps({"nodes": n, "dra_over_extender":
                              round(rows[-2]["pods_per_s"] / ext["pods_per_s"], 2)}), flush=True)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
