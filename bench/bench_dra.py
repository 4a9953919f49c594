"""Pods per second in DRA mode against DRA without hami and extender mode, same bed,
same pods, one run.

DRA runs: real control plane (etcd, kube-apiserver, kube-scheduler, which allocates the
claims) + kube-controller-manager with the resourceclaim controller; every node
publishes one ResourceSlice of 4 cards of 24 GiB, split 10 (as the extender bench's
nodes); the pods ask ``nvidia.com/gpu: 1`` + ``gpumem`` + ``gpucores`` (:func:`pod_limits`).
Three variants (:func:`dra_throughput`): ``plain``, kube-scheduler's own DRA path with a
minimal driver's slices, DeviceClass and templates (the ceiling); ``hami-objects``, hami's
slices and the templates its webhook makes, created beforehand; ``hami``, DRA mode as
deployed (pods through hami's webhook, hami's ``/prioritize`` extender). The clock runs
from the first pod creation until the last pod is seen bound (the same pod watch as
``bench_scheduler.py``). Extender mode: the
``throughput`` run of ``bench_scheduler.py`` with the same node count and pod mix.

``--prioritize``: instead, the cost of one ``/prioritize`` call (DRA mode's node policy)
on the same kind of bed without kube-scheduler: ``--nodes`` published slices and
``--claims`` ResourceClaims, every call scoring all nodes; the listing variant (every
call lists all slices and claims) against the watched one (:mod:`hami.dra.cache`).

Usage::

    PYTHONPATH=src python bench/bench_dra.py --nodes 100 --pods 500 [--no-extender] \
        [--variants plain hami-objects hami] [--metrics-dir DIR]
    PYTHONPATH=src python bench/bench_dra.py --prioritize --nodes 100 1000 --claims 2000 \
        [--policy fragmentation-aware]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


#: The minimal driver of the plain-DRA baseline (no hami object, no hami process).
PLAIN_DRIVER = "gpu.plain.example.com"


def plain_device_class() -> dict[str, Any]:
    """The baseline's DeviceClass: every device of :data:`PLAIN_DRIVER` (CEL selector)."""
    from hami.testing.dranode import device_class

    return device_class(PLAIN_DRIVER)


def plain_slice(node: str) -> dict[str, Any]:
    """The baseline's ResourceSlice of ``node``: the same :data:`GPUS` shareable cards
    as hami's slice (``memory`` bytes, ``cores`` percent, ``shares`` = :data:`SPLIT`),
    without hami's attributes, request policies or owner; the claims ask for all three."""
    mem = CARD_MIB * 2**20
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-plain"},
            "spec": {"driver": PLAIN_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{g}", "allowMultipleAllocations": True,
                                  "capacity": {"memory": {"value": str(mem)},
                                               "cores": {"value": "100"},
                                               "shares": {"value": str(SPLIT)}}}
                                 for g in range(GPUS)]}}


def plain_template(limits: dict[str, int]) -> dict[str, Any]:
    """The baseline's ResourceClaimTemplate for one pod's ``limits`` (as
    :func:`pod_limits`): one device of :data:`PLAIN_DRIVER` with ``gpumem`` MiB, ``gpucores``
    percent (0 when absent) and one share; named by the request."""
    mem, cores = limits["nvidia.com/gpumem"], limits.get("nvidia.com/gpucores", 0)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"plain-gpu-{mem}mi-{cores}c"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": PLAIN_DRIVER, "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": f"{mem}Mi", "cores": str(cores),
                                          "shares": "1"}}}}]}}}}


def plain_pod(i: int, template: str) -> dict[str, Any]:
    """Pod ``p<i>`` of the baseline: one container using the claim of ``template``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i:05d}", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "pause",
                                     "resources": {"claims": [{"name": "gpu-0"}]}}],
                     "resourceClaims": [{"name": "gpu-0",
                                         "resourceClaimTemplateName": template}]}}


#: The variants of :func:`dra_throughput`.
VARIANTS = ("plain", "hami-objects", "hami-webhook", "hami")


def dra_throughput(n_nodes: int, pods: int, variant: str = "hami-objects",
                   metrics_out: Path | None = None,
                   scheduler_qps: float | None = None) -> dict[str, Any]:
    """One DRA run; returns the result row (also printed as JSON).

    ``variant``: ``plain`` (kube-scheduler's own DRA path: :func:`plain_slice`,
    :func:`plain_device_class`, :func:`plain_template`, default profile, no hami),
    ``hami-objects`` (hami's slices and the templates its webhook makes, created
    beforehand, default profile: what this bench measured before) or ``hami`` (hami's
    slices; the pods created as a tenant writes them, ``nvidia.com/gpu`` limits, through
    a real ``hami scheduler --dra-mode`` process's webhook, and scheduled by a profile with
    that process as prioritize-only extender, binpack, as the chart deploys it) or
    ``hami-webhook`` (as ``hami`` without the extender: what the webhook alone costs).
    ``metrics_out``: write kube-scheduler's ``/metrics`` text after the run there.
    ``scheduler_qps``: kube-scheduler's client QPS (burst twice that); ``None``: the
    chart's 100/200 (:meth:`ControlPlane.start_scheduler`).
    """
    from bench.sched_bed import BoundWatcher, plain_watch_client
    from lightkube import codecs

    from hami.core.model import DeviceInfo
    from hami.devices.nvidia import NvidiaConfig
    from hami.dra.node import SlicePublisher
    from hami.dra.slices import DRIVER
    from hami.dra.translate import translate
    from hami.testing.controllers import start_controller_manager
    from hami.testing.controlplane import ControlPlane, create_gpu_node
    from hami.testing.dranode import create_device_class

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} not in {VARIANTS}")
    work = Path(tempfile.mkdtemp(prefix="hami-bench-dra-"))
    hami = None
    qps: dict[str, Any] = ({} if scheduler_qps is None
           else {"client_qps": scheduler_qps, "client_burst": int(2 * scheduler_qps)})
    with ControlPlane(workdir=work / "k8s") as cp:
        cp.start(default_scheduler=False)
        # the bound-time watch must not lose events (as bench_scheduler's beds)
        cp.client = lambda namespace="default", cp=cp: plain_watch_client(cp, namespace)  # type: ignore[method-assign, misc]
        start_controller_manager(cp)
        client = cp.client()
        create_device_class(client, PLAIN_DRIVER if variant == "plain" else DRIVER)
        t0 = time.monotonic()

        def make_node(i: int) -> None:
            name = f"node-{i:05d}"
            create_gpu_node(client, name, gpus=0)
            if variant == "plain":
                client.create(codecs.from_dict(plain_slice(name)))
                return
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
            pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"p{i:05d}", "namespace": "default"},
                   "spec": {"containers": [{"name": "c", "image": "pause",
                                            "resources": {"limits": pod_limits(i)}}]}}
            if variant == "plain":
                tmpl = plain_template(pod_limits(i))
                templates[tmpl["metadata"]["name"]] = tmpl
                objs.append(codecs.from_dict(plain_pod(i, tmpl["metadata"]["name"])))
            elif variant in ("hami", "hami-webhook"):
                pod["spec"]["schedulerName"] = "hami-dra"
                objs.append(codecs.from_dict(pod))
            else:
                result = translate(pod, NvidiaConfig())
                assert result is not None
                templates.update(result.templates)
                objs.append(codecs.from_dict(result.pod))
        for tmpl in templates.values():
            client.create(codecs.from_dict(tmpl), namespace="default")
        if variant in ("hami", "hami-webhook"):
            from tests.e2e.hami_harness import HamiProcess, Tls

            from hami.testing.gpupods import webhook_configuration
            from hami.testing.scheduler_config import ExtenderConfig

            tls = Tls(work / "tls")
            hami = HamiProcess(cp, tls, work, args=[
                "--dra-mode", "--scheduler-name=hami-dra",
                "--node-scheduler-policy=binpack"]).start()
            client.create(codecs.from_dict(webhook_configuration("hami-bench", hami.url,
                                                                 tls.ca_pem)))
            ks = cp.start_scheduler(scheduler_name="hami-dra", extender=ExtenderConfig(
                hami.url, filter_verb=None, bind_verb=None, prioritize_verb="prioritize",
                managed_resources=()) if variant == "hami" else None, **qps)
        else:
            ks = cp.start_scheduler(**qps)
        try:
            watcher = BoundWatcher(cp).start()
            time.sleep(1.0)  # the watch is open and every component idle
            t0 = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(client.create, objs))
            created_s = time.monotonic() - t0
            watcher.wait(pods, timeout_s=1200)
            elapsed = max(watcher.bound_at.values()) - t0
            watcher.stop()
            if metrics_out is not None:
                metrics_out.write_text(scheduler_metrics(cp, ks))
        finally:
            ks.stop()
            if hami is not None:
                hami.stop()
    shutil.rmtree(work, ignore_errors=True)  # etcd's data and the logs of this run
    row = {"mode": "dra" if variant == "hami-objects" else f"dra-{variant}",
           "nodes": n_nodes, "pods": pods, "kube_scheduler_qps": scheduler_qps or 100,
           "pods_per_s": round(pods / elapsed, 1), "seconds": round(elapsed, 1),
           "create_seconds": round(created_s, 1), "node_setup_seconds": round(nodes_s, 1),
           "load_avg": os.getloadavg()[0]}
    print(json.dumps(row), flush=True)
    return row


#: kube-scheduler's metric families that show where a pod's time goes.
SCHEDULER_METRICS = ("scheduler_plugin_execution_duration_seconds",
                     "scheduler_framework_extension_point_duration_seconds",
                     "scheduler_scheduling_attempt_duration_seconds",
                     "scheduler_pod_scheduling_sli_duration_seconds",
                     "scheduler_schedule_attempts_total",
                     # client-go: time waiting in kube-scheduler's own QPS limiter
                     "rest_client_rate_limiter_duration_seconds",
                     "rest_client_request_duration_seconds", "rest_client_requests_total")


def scheduler_metrics(cp: Any, ks: Any) -> str:
    """kube-scheduler's ``/metrics`` (Prometheus text), only the :data:`SCHEDULER_METRICS`
    families' ``_sum`` and ``_count`` lines (and counters); fetched with the admin client
    certificate (kube-scheduler delegates authorization to the apiserver; its serving
    certificate is self-signed, so it is not verified)."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.load_cert_chain(cp.pki_dir / "admin.crt", cp.pki_dir / "admin.key")
    with urllib.request.urlopen(f"https://127.0.0.1:{ks.port}/metrics", context=ctx,
                                timeout=30) as resp:
        text = resp.read().decode()
    return "".join(line + "\n" for line in text.splitlines()
                   if line.startswith(SCHEDULER_METRICS) and "_bucket" not in line)


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
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                    help="DRA runs per node count (dra_throughput)")
    ap.add_argument("--scheduler-qps", type=float,
                    help="kube-scheduler's client QPS in the DRA runs (default the chart's 100)")
    ap.add_argument("--metrics-dir", type=Path,
                    help="write kube-scheduler's /metrics of each DRA run here")
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
        by_mode = {}
        for variant in args.variants:
            metrics = (args.metrics_dir / f"ks_metrics_{variant}_{n}.txt"
                       if args.metrics_dir else None)
            if metrics is not None:
                metrics.parent.mkdir(parents=True, exist_ok=True)
            row = dra_throughput(n, args.pods, variant, metrics, args.scheduler_qps)
            rows.append(row)
            by_mode[row["mode"]] = row["pods_per_s"]
        if not args.no_extender:
            from bench.bench_scheduler import throughput

            ext = throughput([n], args.pods, ["binpack"])[0]
            rows.append({**ext, "mode": "extender-binpack"})
            by_mode["extender-binpack"] = ext["pods_per_s"]
        plain = by_mode.get("dra-plain")
        ratios = {f"{m}_over_plain": round(v / plain, 2)
                  for m, v in by_mode.items() if plain and m != "dra-plain"}
        print(json.dumps({"nodes": n, **ratios}), flush=True)
        rows.append({"nodes": n, "pods_per_s": by_mode, **ratios})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
