"""Node-side benchmarks: Allocate latency and monitor scrape time, plus resident memory.

Runs the real processes against a real control plane (etcd + kube-apiserver from
``hack/k8s/build.sh``):

* ``hami device-plugin`` (fake GPU backend) as a child process; this process plays the
  kubelet (and, after each Allocate, marks the pod Running as kubelet would once its
  containers start). Each measured Allocate = kubelet gRPC call -> plugin: node from its
  watch, LIST of the node's Pending pods, PATCH to-allocate + bind-phase; the node lock
  is released after the answer (all real API round trips).
* ``hami monitor`` as a child process over 100 container directories with 1.2 cache files
  (2 processes x 2 GPUs each) and 100 matching pods; each measured scrape is an HTTP GET
  of ``/metrics``.

Targets (issue 4): Allocate p99 <= 50 ms; scrape <= 100 ms with 100 containers; each
process <= 100 MiB resident.

Usage: ``PYTHONPATH=src python bench/bench_node.py [--pods 200] [--containers 100]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.node.fakes import FakeKubelet  # noqa: E402
from tests.node.regionfile import Proc, RegionSpec, build  # noqa: E402

from hami.deviceplugin import allocate as al  # noqa: E402
from hami.testing.controlplane import (  # noqa: E402
    ControlPlane,
    create_gpu_node,
    die_with_parent,
    free_port,
    set_pod_phase,
)

NODE = "bench-node"
GPUS = [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(8)]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def take_lock(client: Any, name: str) -> None:
    """Like the scheduler's Bind: wait until the node is unlocked, then CAS the lock in."""
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node
    from lightkube.types import PatchType

    while True:
        n = client.get(Node, NODE)
        if al.NODE_LOCK in (n.metadata.annotations or {}):
            time.sleep(0.002)
            continue
        try:
            client.patch(Node, NODE, {"metadata": {"annotations": {
                al.NODE_LOCK: f"2026-11-29T08:00:00Z,default,{name}"},
                "resourceVersion": n.metadata.resourceVersion}}, patch_type=PatchType.MERGE)
            return
        except ApiError:
            continue


def bench_allocate(cp: ControlPlane, client: Any, work: Path, n: int) -> dict[str, float]:
    import yaml
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import PatchType

    inv = work / "inv.yaml"
    inv.write_text(yaml.safe_dump({"gpus": [{"model": "NVIDIA A100-SXM4-80GB",
                                             "memory_mib": 81920, "uuids": [u]} for u in GPUS]}))
    kubelet = FakeKubelet(work / "dp")
    kubelet.start()
    code = ("import typer; from hami.deviceplugin.command import device_plugin; "
            "typer.run(device_plugin)")
    argv = ["--node-name", NODE, "--hook-path", str(work / "hook"), "--device-plugin-path",
            str(work / "dp"), "--backend", "fake", "--fake-inventory", str(inv),
            "--kubeconfig", str(cp.kubeconfig), "--lock-dir", str(work / "lock"),
            "--node-config-file", str(work / "none.json"),
            # the pods below carry hand-written, unsigned allocations (HAMi's protocol)
            "--trust-unsigned-allocations"]
    proc = subprocess.Popen([sys.executable, "-c", code, *argv],
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                            stdout=(work / "plugin.log").open("wb"), stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    try:
        kubelet.wait_registered(timeout_s=30)
        kubelet.wait_list(lambda d: len(d) == 80, timeout_s=30)
        lat = []
        for k in range(n):
            name = f"b{k}"
            g = GPUS[k % len(GPUS)]
            ann = {al.DEVICES_TO_ALLOCATE: f"{g},NVIDIA,1000,10:;", al.VGPU_NODE: NODE,
                   al.BIND_PHASE: "allocating", al.BIND_TIME: str(int(time.time())),
                   "hami.io/vgpu-devices-allocated": f"{g},NVIDIA,1000,10:;"}
            client.create(Pod.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": name, "namespace": "default", "annotations": ann,
                "labels": {al.VGPU_NODE: NODE}}, "spec": {"nodeName": NODE, "containers": [
                    {"name": "main", "image": "busybox"}]}}))
            take_lock(client, name)
            t0 = time.perf_counter()
            resp = kubelet.allocate([f"{g}-{k % 10}"])
            lat.append((time.perf_counter() - t0) * 1000)
            assert resp.container_responses[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
            set_pod_phase(client, name, "default", "Running")
        pod = client.get(Pod, f"b{n - 1}", namespace="default")
        assert pod.metadata.annotations[al.BIND_PHASE] == "success"
        # the API alone, same client stack, for context: one GET and one merge PATCH
        api_get, api_patch = [], []
        for k in range(n):
            t0 = time.perf_counter()
            client.get(Pod, "b0", namespace="default")
            api_get.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            client.patch(Pod, "b0", {"metadata": {"annotations": {"bench": str(k)}}},
                         namespace="default", patch_type=PatchType.MERGE)
            api_patch.append((time.perf_counter() - t0) * 1000)
        return {"allocate_p50_ms": statistics.median(lat), "allocate_p99_ms": pct(lat, 0.99),
                "allocate_max_ms": max(lat), "allocations": n, "plugin_rss_mib": rss_mib(proc.pid),
                "api_get_pod_p50_ms": statistics.median(api_get),
                "api_get_pod_p99_ms": pct(api_get, 0.99),
                "api_patch_pod_p50_ms": statistics.median(api_patch),
                "api_patch_pod_p99_ms": pct(api_patch, 0.99)}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        kubelet.stop()


def bench_monitor(cp: ControlPlane, work: Path, containers: int, scrapes: int,
                  pods_created: int) -> dict[str, float]:
    hook = work / "mon"
    root = hook / "containers"
    from lightkube import Client, KubeConfig
    from lightkube.resources.core_v1 import Pod

    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)))
    pods = list(client.list(Pod, namespace="default", labels={al.VGPU_NODE: NODE}))
    assert len(pods) >= containers, "allocate bench creates the pods the monitor reports"
    from lightkube.types import PatchType

    both = f"{GPUS[0]},NVIDIA,1000,10:{GPUS[1]},NVIDIA,1000,10:;"
    for p in pods[:containers]:
        # the monitor reports only the GPUs a pod was granted: grant the two of the file
        client.patch(Pod, p.metadata.name, {"metadata": {"annotations": {
            "hami.io/vgpu-devices-allocated": both}}}, namespace="default",
            patch_type=PatchType.MERGE)
        d = root / f"{p.metadata.uid}_main"
        d.mkdir(parents=True, exist_ok=True)
        (d / "libvgpu.so").touch()
        spec = RegionSpec(uuids=(GPUS[0], GPUS[1]), limits={0: 2**30, 1: 2**30},
                          last_kernel_time=int(time.time()),
                          procs=[Proc(pid=10 + i, status=1, used={0: (1, 0, 2, 0, 3), 1: (1, 0, 1, 0, 2)},
                                      sm_util={0: 5}) for i in range(2)])
        (d / "a.cache").write_bytes(bytes(build(spec)))
    port = free_port()
    code = "import typer; from hami.monitor.command import monitor; typer.run(monitor)"
    proc = subprocess.Popen([sys.executable, "-c", code, "--metrics-bind-address",
                             f"127.0.0.1:{port}", "--kubeconfig", str(cp.kubeconfig)],
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "NODE_NAME": NODE,
                                 "HOOK_PATH": str(hook)},
                            stdout=(work / "monitor.log").open("wb"), stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 60
        while True:
            try:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
                if body.count("hami_vgpu_memory_used_bytes{") >= 2 * containers:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("monitor never reported the containers; see monitor.log")
            time.sleep(0.5)
        lat = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            body = urllib.request.urlopen(url, timeout=5).read()
            lat.append((time.perf_counter() - t0) * 1000)
        return {"scrape_p50_ms": statistics.median(lat), "scrape_p99_ms": pct(lat, 0.99),
                "scrape_bytes": len(body), "containers": containers,
                "monitor_rss_mib": rss_mib(proc.pid)}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--containers", type=int, default=100)
    ap.add_argument("--scrapes", type=int, default=100)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hb", dir="/tmp"))
    with ControlPlane() as cp:
        cp.start()
        client = cp.client()
        create_gpu_node(client, NODE, gpus=80)
        out = bench_allocate(cp, client, work, max(args.pods, args.containers))
        out.update(bench_monitor(cp, work, args.containers, args.scrapes, args.pods))
    out["targets"] = {"allocate_p99_ms": 50, "scrape_ms": 100, "rss_mib": 100}
    out["loadavg_1m_5m_15m"] = os.getloadavg()
    out["cpus"] = os.cpu_count()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
