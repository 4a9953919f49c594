"""Benchmarks of ``hami scheduler``.

1. ``throughput``: a burst of pods through the real kube-scheduler alone (``vanilla``)
   and with hami as its extender (``binpack``, ``spread``), side by side at 100 and 1,000
   nodes (real control plane: etcd, kube-apiserver, kube-scheduler; hami as its own
   process; a fake device-plugin Allocate releases node locks): pods/s and the ratio to
   vanilla, create-to-bound latency per pod, API requests per pod by verb (the API
   server's own counters), CPU per pod by process, and hami's filter/bind histograms.
2. ``memory``: resident memory of a scheduler process whose caches hold 5,000 nodes and
   40,000 GPU pods (fed through the same list/relist path as in production, from an
   in-memory API stand-in so the 2-core machine does not also have to run etcd with
   40k pods), and filter latency at that size.

Usage::

    PYTHONPATH=src python bench/bench_scheduler.py throughput --nodes 100 1000 --pods 400
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
#: ``-cdi``: the nodes advertise the device plugin's allocate mode ``cdi``
#: (``hami.io/node-allocate-mode``): binds take no node lock, and the fake device plugin
#: plays PreStartContainer (no write: the Binding already says ``bind-phase=success``;
#: the label alone where the Binding did not bring it; no lock to release).
MODES = ("vanilla", "binpack", "spread", "binpack-cdi", "spread-cdi")


def run_bed(n_nodes: int, pods: int, mode: str, hami_args: list[str] | None = None,
            client_qps: float | None = None, extender_tls: bool = False) -> dict[str, Any]:
    """One burst of ``pods`` pods on a fresh control plane with ``n_nodes`` nodes.

    ``mode`` ``vanilla``: kube-scheduler alone, pods asking for no GPU (the ceiling of the
    bed); ``binpack``/``spread``: kube-scheduler with hami as its extender under that node
    policy, GPU pods, a fake device-plugin Allocate releasing the node locks;
    ``binpack-cdi``/``spread-cdi``: the same with nodes in allocate mode ``cdi``. The clock
    starts before the first create and stops when the last pod is seen bound.
    kube-scheduler calls hami as the chart has it: plain HTTP on a loopback listener
    (``--extender-http-bind``), or with ``extender_tls`` over HTTPS on the main port (HAMi's
    chart).
    """
    from bench.sched_bed import (
        BoundWatcher,
        CpuMeter,
        api_requests,
        per_pod,
        plain_watch_client,
        quantiles_ms,
        settle,
    )
    from lightkube import codecs
    from tests.e2e.hami_harness import FakeAllocator, HamiProcess, Tls, gpu_pod, make_gpu_node

    from hami.testing.controlplane import ControlPlane, free_port
    from hami.testing.scheduler_config import CLIENT_QPS, ExtenderConfig

    work = Path(tempfile.mkdtemp(prefix="hami-bench-"))
    with ControlPlane(workdir=work / "k8s") as cp:
        cp.start(default_scheduler=False)
        # the harness's watches (bound times, fake Allocate) must not lose events
        cp.client = lambda namespace="default", cp=cp: plain_watch_client(cp, namespace)
        client = cp.client()
        t0 = time.monotonic()
        policy, _, allocate_mode = mode.partition("-")
        node_ann = {"hami.io/node-allocate-mode": allocate_mode} if allocate_mode else None
        make_gpu_node(client, "node-00000", annotations=node_ann)  # warm types in one thread
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i, c=client: make_gpu_node(c, f"node-{i:05d}",
                                                            annotations=node_ann),
                          range(1, n_nodes)))
        nodes_s = time.monotonic() - t0
        limits: dict[str, Any] = {} if client_qps is None else {
            "client_qps": client_qps, "client_burst": int(2 * client_qps)}
        hami = allocator = None
        if mode == "vanilla":
            specs = [gpu_pod(f"p{i:05d}", gpus=0) for i in range(pods)]
            ks = cp.start_scheduler(**limits)
        else:
            tls = Tls(work / "tls")
            plain_port = free_port()
            listener = [] if extender_tls else [f"--extender-http-bind=127.0.0.1:{plain_port}"]
            hami = HamiProcess(cp, tls, work, args=[f"--node-scheduler-policy={policy}",
                                                    "--register-interval=15s", *listener,
                                                    *(hami_args or [])]).start()
            allocator = FakeAllocator(cp, lock_free=bool(allocate_mode)).start()
            specs = [gpu_pod(f"p{i:05d}", memory_mib=1000 + (i % 7) * 500,
                             cores=(i % 3) * 10 or None, scheduler_name="hami-scheduler")
                     for i in range(pods)]
            extender = (ExtenderConfig(hami.url) if extender_tls else
                        ExtenderConfig(f"http://127.0.0.1:{plain_port}", enable_https=False))
            ks = cp.start_scheduler(scheduler_name="hami-scheduler", extender=extender,
                                    **limits)
        objs = [codecs.from_dict(p) for p in specs]  # msgspec: first decodes not thread-safe
        procs = {c.name: c.process.pid for c in cp._components if c.process.poll() is None}
        if hami is not None and hami.process is not None:
            procs["hami"] = hami.process.pid
        watcher = BoundWatcher(cp).start()
        time.sleep(1.0)  # the watch is open and every component idle
        created_at: dict[str, float] = {}

        def create(obj: Any, c: Any = client) -> None:
            created_at[obj.metadata.name] = time.monotonic()
            c.create(obj)

        meter = CpuMeter(procs)
        before = api_requests(cp)
        meter.start()
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, objs))
        created_s = time.monotonic() - t0
        watcher.wait(pods, timeout_s=1200)
        elapsed = max(watcher.bound_at.values()) - t0
        after = settle(cp)  # the last Allocates and queued events land (they count too)
        cpu = meter.stop(pods)
        watcher.stop()
        latency = [watcher.bound_at[n] - created_at[n] for n in created_at]
        result: dict[str, Any] = {
            "mode": mode, "nodes": n_nodes, "pods": pods, "hami_args": hami_args or [],
            "extender": None if mode == "vanilla" else ("https" if extender_tls else "http"),
            "kube_scheduler_qps": client_qps or CLIENT_QPS,
            "pods_per_s": round(pods / elapsed, 1), "seconds": round(elapsed, 1),
            "create_seconds": round(created_s, 1), "node_setup_seconds": round(nodes_s, 1),
            "create_to_bound_ms": quantiles_ms(latency),
            "api_per_pod": per_pod(before, after, pods),
            "cpu_ms_per_pod": cpu,
            "load_avg": os.getloadavg()[0],
        }
        if hami is not None:
            text = hami.metrics()
            filt = histogram(text, "hami_scheduler_filter_duration_seconds")
            bind = histogram(text, "hami_scheduler_bind_duration_seconds")
            status = hami.status()
            result.update({
                "filter_ms": {q: round(1000 * percentile(filt, q), 2) for q in (0.5, 0.99)},
                "bind_ms": {q: round(1000 * percentile(bind, q), 2) for q in (0.5, 0.99)},
                "filters": status.get("counters", {}).get("filters"),
                "binds": status.get("counters", {}).get("binds"),
                "scheduler_rss_mib": round(_rss_kib(procs["hami"]) / 1024, 1)})
        ks.stop()
        if allocator is not None:
            allocator.stop()
        if hami is not None:
            hami.stop()
    return result


def throughput(node_counts: list[int], pods: int, modes: list[str],
               hami_args: list[str] | None = None,
               client_qps: float | None = None,
               extender_tls: bool = False) -> list[dict[str, Any]]:
    """Every mode at every node count, one fresh bed each; hami's modes also as a ratio
    to ``vanilla`` (when it ran) at the same size."""
    results = []
    for n_nodes in node_counts:
        vanilla = None
        for mode in modes:
            result = run_bed(n_nodes, pods, mode, hami_args, client_qps, extender_tls)
            if mode == "vanilla":
                vanilla = result
            elif vanilla is not None:
                result["ratio_to_vanilla"] = round(result["pods_per_s"] / vanilla["pods_per_s"], 2)
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


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
    t.add_argument("--pods", type=int, default=400)
    t.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="vanilla: kube-scheduler alone; binpack/spread: hami's node policy")
    t.add_argument("--hami-arg", action="append", default=[], help="extra hami scheduler flag")
    t.add_argument("--client-qps", type=float, default=None,
                   help="kube-scheduler clientConnection.qps (burst = 2x); default: the chart's")
    t.add_argument("--extender-tls", action="store_true",
                   help="kube-scheduler calls hami over HTTPS (HAMi's chart), not plain HTTP "
                        "on loopback (this chart's default)")
    m = sub.add_parser("memory")
    m.add_argument("--nodes", type=int, default=5000)
    m.add_argument("--pods", type=int, default=40000)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.cmd == "throughput":
        throughput(args.nodes, args.pods, args.modes, args.hami_arg, args.client_qps,
                   args.extender_tls)
    else:
        memory(args.nodes, args.pods)


if __name__ == "__main__":
    main()
