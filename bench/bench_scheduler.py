"""Benchmarks of ``hami scheduler``.

1. ``throughput``: pods per second through the real kube-scheduler + hami (real
   control plane: etcd, kube-apiserver, kube-scheduler; hami as its own process; a fake
   device-plugin Allocate releases node locks) at 100 and 1,000 nodes, and the filter /
   bind latency percentiles read from hami's own Prometheus histograms.
2. ``memory``: resident memory of a scheduler process whose caches hold 5,000 nodes and
   40,000 GPU pods (fed through the same list/relist path as in production, from an
   in-memory API stand-in so the 2-core machine does not also have to run etcd with
   40k pods), and filter latency at that size.

Usage::

    PYTHONPATH=src python bench/bench_scheduler.py throughput --nodes 100 1000 --pods 500
    PYTHONPATH=src python bench/bench_scheduler.py memory --nodes 5000 --pods 40000

Targets (2-core machine, control plane included): >= 50 pods/s at 1,000 nodes; extender
share of the per-pod latency <= 20 ms p99; <= 300 MiB resident.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


# ------------------------------------------------------------------ histograms
def histogram(text: str, name: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) of a Prometheus histogram, all label sets summed."""
    buckets: dict[float, float] = {}
    for m in re.finditer(rf'^{name}_bucket\{{([^}}]*)\}} ([0-9.e+-]+)$', text, re.M):
        le = re.search(r'le="([^"]+)"', m.group(1))
        assert le
        bound = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
        buckets[bound] = buckets.get(bound, 0.0) + float(m.group(2))
    return sorted(buckets.items())


def percentile(buckets: list[tuple[float, float]], q: float) -> float:
    """Linear interpolation inside the bucket holding quantile ``q`` (as PromQL does)."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            span = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / span if span else 1.0)
        prev_le, prev_count = le, count
    return prev_le


# ------------------------------------------------------------------ throughput
def throughput(node_counts: list[int], pods: int, policy: str,
               hami_args: list[str] | None = None,
               precreate: bool = False,
               client_qps: float | None = None) -> list[dict[str, Any]]:
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod
    from tests.e2e.hami_harness import FakeAllocator, HamiProcess, Tls, gpu_pod, make_gpu_node

    from hami.testing.controlplane import ControlPlane, wait_until
    from hami.testing.scheduler_config import ExtenderConfig

    results = []
    for n_nodes in node_counts:
        work = Path(tempfile.mkdtemp(prefix="hami-bench-"))
        with ControlPlane(workdir=work / "k8s") as cp:
            cp.start(default_scheduler=False)
            client = cp.client()
            t0 = time.monotonic()
            make_gpu_node(client, "node-00000")  # warm lightkube/msgspec types in one thread
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i, c=client: make_gpu_node(c, f"node-{i:05d}"),
                              range(1, n_nodes)))
            nodes_s = time.monotonic() - t0
            tls = Tls(work / "tls")
            hami = HamiProcess(cp, tls, work, args=[f"--node-scheduler-policy={policy}",
                                                    "--register-interval=15s",
                                                    *(hami_args or [])]).start()
            allocator = FakeAllocator(cp).start()
            specs = [gpu_pod(f"p{i:05d}", memory_mib=1000 + (i % 7) * 500,
                             cores=(i % 3) * 10 or None, scheduler_name="hami-scheduler")
                     for i in range(pods)]
            objs = [codecs.from_dict(p) for p in specs]  # msgspec: first decodes not thread-safe

            def create_all(c: Any = client, objs: list[Any] = objs) -> float:
                started = time.monotonic()
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(c.create, objs))
                return time.monotonic() - started

            limits: dict[str, Any] = {} if client_qps is None else {
                "client_qps": client_qps, "client_burst": int(2 * client_qps)}
            from hami.testing.scheduler_config import CLIENT_QPS
            if precreate:  # all pods Pending first; the clock starts with kube-scheduler
                created_s = create_all()
                t0 = time.monotonic()
                ks = cp.start_scheduler(scheduler_name="hami-scheduler",
                                        extender=ExtenderConfig(hami.url), **limits)
            else:
                ks = cp.start_scheduler(scheduler_name="hami-scheduler",
                                        extender=ExtenderConfig(hami.url), **limits)
                t0 = time.monotonic()
                created_s = create_all()

            def all_bound(c: Any = client) -> bool:
                try:
                    return sum(1 for p in c.list(Pod, namespace="default")
                               if p.spec.nodeName) >= pods
                except Exception:  # a busy apiserver: ask again
                    return False

            wait_until(all_bound, timeout_s=1200, what="all pods bound")
            elapsed = time.monotonic() - t0
            text = hami.metrics()
            filt = histogram(text, "hami_scheduler_filter_duration_seconds")
            bind = histogram(text, "hami_scheduler_bind_duration_seconds")
            status = hami.status()
            rss = _rss_kib(hami.process.pid if hami.process else 0)
            cpu = _cpu_s(hami.process.pid if hami.process else 0)
            result = {
                "nodes": n_nodes, "pods": pods, "node_policy": policy,
                "hami_args": hami_args or [], "precreated": precreate,
                "kube_scheduler_qps": client_qps or CLIENT_QPS,
                "pods_per_s": round(pods / elapsed, 1), "seconds": round(elapsed, 1),
                "create_seconds": round(created_s, 1), "node_setup_seconds": round(nodes_s, 1),
                "filter_ms": {q: round(1000 * percentile(filt, q), 2) for q in (0.5, 0.9, 0.99)},
                "bind_ms": {q: round(1000 * percentile(bind, q), 2) for q in (0.5, 0.9, 0.99)},
                "filters": status.get("counters", {}).get("filters"),
                "binds": status.get("counters", {}).get("binds"),
                "scheduler_rss_mib": round(rss / 1024, 1),
                "scheduler_cpu_s": round(cpu, 1),
                "load_avg": os.getloadavg()[0],
            }
            print(json.dumps(result), flush=True)
            results.append(result)
            ks.stop()
            allocator.stop()
            hami.stop()
    return results


def baseline(node_counts: list[int], pods: int, precreate: bool = False) -> list[dict[str, Any]]:
    """The same control plane and pod stream without hami: the default kube-scheduler
    binding pods that ask for no GPU. The ceiling this machine allows."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod
    from tests.e2e.hami_harness import gpu_pod, make_gpu_node

    from hami.testing.controlplane import ControlPlane, wait_until

    results = []
    for n_nodes in node_counts:
        work = Path(tempfile.mkdtemp(prefix="hami-bench-"))
        with ControlPlane(workdir=work / "k8s") as cp:
            cp.start(default_scheduler=not precreate)
            client = cp.client()
            make_gpu_node(client, "node-00000")
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i, c=client: make_gpu_node(c, f"node-{i:05d}"),
                              range(1, n_nodes)))
            objs = [codecs.from_dict(gpu_pod(f"p{i:05d}", gpus=0)) for i in range(pods)]
            t0 = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(client.create, objs))
            created_s = time.monotonic() - t0
            if precreate:
                t0 = time.monotonic()
                cp.start_scheduler()

            def all_bound(c: Any = client) -> bool:
                return sum(1 for p in c.list(Pod, namespace="default") if p.spec.nodeName) >= pods

            wait_until(all_bound, timeout_s=1200, what="all pods bound")
            elapsed = time.monotonic() - t0
            result = {"baseline": "kube-scheduler without hami", "nodes": n_nodes, "pods": pods,
                      "precreated": precreate,
                      "pods_per_s": round(pods / elapsed, 1), "seconds": round(elapsed, 1),
                      "create_seconds": round(created_s, 1), "load_avg": os.getloadavg()[0]}
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------------- memory
def memory(n_nodes: int, n_pods: int) -> dict[str, Any]:
    """Run in a fresh interpreter so RSS reflects only this scheduler."""
    from datetime import timedelta

    from tests.integration.fake_kube import FakeKube
    from tests.integration.support import gpu_pod, node

    import hami.kube  # noqa: F401  (what the real process imports)
    import hami.scheduler.server  # noqa: F401
    from hami.core.codec import encode_pod_devices
    from hami.core.model import ContainerDevice
    from hami.scheduler.engine import Engine
    from hami.scheduler.settings import SchedulerSettings

    base = _rss_kib(0)

    def make_pod(i: int) -> dict[str, Any]:
        n = i % n_nodes
        k = (i // n_nodes) % 8
        pod = gpu_pod(f"p{i:06d}", memory_mib=2000, cores=10)
        pod["metadata"]["uid"] = f"0b5c7e2a-{i:04x}-4d3f-9a51-{i:012x}"
        dev = encode_pod_devices(((ContainerDevice(f"GPU-node-{n:05d}-{k}", "NVIDIA", 2000, 10),),))
        pod["metadata"]["annotations"].update({
            "hami.io/vgpu-node": f"node-{n:05d}", "hami.io/vgpu-devices-allocated": dev,
            "hami.io/vgpu-devices-to-allocate": dev, "hami.io/bind-phase": "success",
            "hami.io/vgpu-time": "1790000000", "hami.io/bind-time": "1790000000"})
        pod["metadata"]["labels"] = {"app": "bench", "hami.io/vgpu-node": f"node-{n:05d}"}
        pod["spec"]["nodeName"] = f"node-{n:05d}"
        pod["status"] = {"phase": "Running", "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}
        return pod

    class GeneratedKube(FakeKube):
        """Objects are made as the list streams them, as a chunked list over the network
        would deliver them: nothing but the scheduler's own caches stays in memory."""

        async def list(self, kind: str, on_item: Any) -> str:
            if kind == "Node":
                for i in range(n_nodes):
                    on_item(node(f"node-{i:05d}", gpus=8))
            elif kind == "Pod":
                for i in range(n_pods):
                    on_item(make_pod(i))
            return "1"

    kube = GeneratedKube()
    settings = SchedulerSettings(events=False, register_interval=timedelta(hours=1))
    out: dict[str, Any] = {"nodes": n_nodes, "pods": n_pods}

    async def run() -> None:
        engine = Engine(settings, kube)
        t0 = time.perf_counter()
        await engine.start()
        out["initial_sync_s"] = round(time.perf_counter() - t0, 2)
        gc.collect()
        out["rss_mib"] = round(_rss_kib(0) / 1024, 1)
        out["rss_before_caches_mib"] = round(base / 1024, 1)
        out["ledger_pods"] = sum(1 for _ in engine.state.ledger.pods())
        names = [f"node-{i:05d}" for i in range(n_nodes)]
        lat = []
        for i in range(300):
            pod = gpu_pod(f"new{i}", memory_mib=1000 + i % 5 * 1000, cores=5)
            t = time.perf_counter()
            engine.state.filter(pod, sorted(names))
            lat.append(time.perf_counter() - t)
        lat.sort()
        out["filter_decision_ms"] = {"p50": round(1000 * lat[150], 2),
                                     "p99": round(1000 * lat[296], 2)}
        await engine.stop()

    asyncio.run(run())
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    t.add_argument("--pods", type=int, default=500)
    t.add_argument("--node-policy", default="binpack")
    t.add_argument("--baseline", action="store_true", help="no hami: default kube-scheduler")
    t.add_argument("--hami-arg", action="append", default=[], help="extra hami scheduler flag")
    t.add_argument("--precreate", action="store_true",
                   help="create every pod first, then start kube-scheduler (scheduling only)")
    t.add_argument("--client-qps", type=float, default=None,
                   help="kube-scheduler clientConnection.qps (burst = 2x); default: the chart's")
    m = sub.add_parser("memory")
    m.add_argument("--nodes", type=int, default=5000)
    m.add_argument("--pods", type=int, default=40000)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.cmd == "throughput" and args.baseline:
        baseline(args.nodes, args.pods, args.precreate)
    elif args.cmd == "throughput":
        throughput(args.nodes, args.pods, args.node_policy, args.hami_arg, args.precreate,
                   args.client_qps)
    else:
        memory(args.nodes, args.pods)


if __name__ == "__main__":
    main()
