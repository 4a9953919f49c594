"""End-to-end burst on the real node: hami's node lock against allocate mode ``cdi``.

Each mode runs on its own :class:`hami.testing.gpubed.GpuBed` (etcd, kube-apiserver,
kube-scheduler with hami as its extender, the real kubelet and containerd 2.x, hami's
device plugin on fake GPUs): a burst of ``--pods`` GPU pods, each a slice of one of four
8 GiB stub cards, all fitting on the node, created at once (8 threads). Modes:

* ``vanilla``: on the ``node-lock`` bed, before its GPU burst, the same number of pods
  asking for no GPU through the default kube-scheduler: the reference of the bed;
* ``node-lock``: hami's device plugin in HAMi's mode (node lock held from ``/bind`` until
  the kubelet's Allocate);
* ``cdi``: ``--allocate-mode=cdi`` (no lock; the limits are written at
  PreStartContainer into a CDI spec containerd injects).

Reported per burst: pods/s to Running (first seen Running or finished), create->bound and
create->running p50/p99, hami's ``/bind`` and node-lock wait p50/p99 (its decision log),
the kubelet's Allocate count, PreStartContainer served/failed (the plugin's log),
container-creation errors and "unresolvable CDI devices" (kubelet metrics, pod events,
kubelet and containerd logs), API requests per pod (every client, the kubelet's status
writes included), CPU per pod of the bed's processes (containerd shims and runc not
counted), the load average. Each burst is then checked: every pod Succeeded, its log
shows its own ``CUDA_DEVICE_MEMORY_LIMIT_0`` and libvgpu's total (``vgtest info``) equal
to its request, ``NVIDIA_VISIBLE_DEVICES`` the card it was granted, and no card is booked
beyond its memory.

Usage (root; the real-node prerequisites of docs/testbed.md)::

    PYTHONPATH=src python bench/bench_realnode.py --pods 24 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from bench.sched_bed import (  # noqa: E402
    CpuMeter,
    api_requests,
    per_pod,
    quantiles_ms,
    settle,
)

from hami.testing.gpubed_cli import CDI_PLUGIN_ARGS  # noqa: E402

GPUS = 4
CARD_MIB = 8192
CDI_ARGS = CDI_PLUGIN_ARGS
SHOW_ENV = "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_DEVICE_MEMORY_LIMIT_0)=' | sort"
UNRESOLVABLE = "unresolvable CDI devices"


def slice_mib(i: int) -> int:
    """Pod ``i``'s slice: 512-1536 MiB; 24 pods book 24,064 of 32,768 MiB, and whatever
    the order, a card cannot be left too fragmented for the next pod."""
    return 512 + (i % 5) * 256


class PodClock:
    """A pod watch in a thread: when each pod was first seen bound, running (Running,
    Succeeded or Failed) and finished."""

    def __init__(self, bed: Any) -> None:
        self.bed = bed
        self.bound_at: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self.done_at: dict[str, float] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        from lightkube.resources.core_v1 import Pod

        client = self.bed.client()
        while not self._stop.is_set():
            try:
                for _, pod in client.watch(Pod, namespace="default", server_timeout=5):
                    name, now = pod.metadata.name, time.monotonic()
                    phase = pod.status.phase if pod.status else None
                    if pod.spec.nodeName:
                        self.bound_at.setdefault(name, now)
                    if phase in ("Running", "Succeeded", "Failed"):
                        self.running_at.setdefault(name, now)
                    if phase in ("Succeeded", "Failed"):
                        self.done_at.setdefault(name, now)
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - a watch timeout or a dropped connection
                time.sleep(0.1)

    def wait_done(self, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(n in self.done_at for n in names):
            if time.monotonic() > deadline:
                left = [n for n in names if n not in self.done_at]
                raise TimeoutError(f"{len(left)} pods not finished after {timeout_s}s: {left[:5]}")
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()


class LogTail:
    """Lines appended to a log file since this object was made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                return f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return []


def kubelet_metrics(bed: Any) -> dict[str, float]:
    """The kubelet's counters this benchmark reads (its /metrics, admin certificate)."""
    import ssl
    import urllib.request

    assert bed.node is not None and bed.cp is not None
    # the kubelet serves a self-signed certificate; it takes the admin client certificate
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(bed.cp.pki_dir / "admin.crt", bed.cp.pki_dir / "admin.key")
    url = f"https://127.0.0.1:{bed.node.kubelet_port}/metrics"
    with urllib.request.urlopen(url, context=ctx, timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'^(kubelet_device_plugin_alloc_duration_seconds_count|'
                     r'kubelet_started_containers_errors_total)(\{[^}]*\})? ([0-9.e+-]+)$', line)
        if m:
            key = m.group(1) + (m.group(2) or "")
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def field_values(lines: list[str], msg: str, key: str, pod_prefix: str) -> list[float]:
    """Values of ``key=<number>`` in hami's key=value lines ``msg=<msg>`` for our pods."""
    out = []
    for ln in lines:
        if f"msg={msg} " in ln and f"pod=default/{pod_prefix}" in ln:
            m = re.search(rf"\b{key}=([0-9.]+)", ln)
            if m:
                out.append(float(m.group(1)))
    return out


def pod_manifest(name: str, i: int, gpu: bool) -> dict[str, Any]:
    from hami.testing.gpupods import gpu_test_pod

    if gpu:
        return gpu_test_pod(name, f"{SHOW_ENV}; vgtest init info; sleep 2",
                            memory_mib=slice_mib(i), stub_devices=GPUS,
                            stub_memory_mib=CARD_MIB)
    pod = gpu_test_pod(name, "echo ok; sleep 2", stub_devices=GPUS, stub_memory_mib=CARD_MIB)
    pod["spec"]["containers"][0]["resources"] = {}
    return pod


def check(bed: Any, names: list[str], gpu: bool) -> list[str]:
    """What is wrong with the finished burst (empty: nothing)."""
    from lightkube.resources.core_v1 import Pod

    from hami.core.codec import decode_pod_devices

    client = bed.client()
    problems: list[str] = []
    booked: dict[str, int] = {}
    try:
        for i, name in enumerate(names):
            pod = client.get(Pod, name)
            if pod.status.phase != "Succeeded":
                problems.append(f"{name}: {pod.status.phase}")
            if not gpu:
                continue
            log = bed.node.container_log("default", name, "c")
            env = dict(ln.split("=", 1) for ln in log.splitlines() if "=" in ln)
            want = slice_mib(i)
            if env.get("CUDA_DEVICE_MEMORY_LIMIT_0") != f"{want}m":
                problems.append(f"{name}: limit {env.get('CUDA_DEVICE_MEMORY_LIMIT_0')}, "
                                f"asked {want}m")
            info = re.search(r"^info \d+ (\d+)", log, re.M)
            if not info or int(info.group(1)) != want << 20:
                problems.append(f"{name}: vgtest info {info.group(0) if info else None}")
            ann = pod.metadata.annotations or {}
            grant = decode_pod_devices(ann.get("hami.io/vgpu-devices-allocated", ""))
            devices = [d for ctr in grant for d in ctr]
            if [d.uuid for d in devices] != [env.get("NVIDIA_VISIBLE_DEVICES")]:
                problems.append(f"{name}: sees {env.get('NVIDIA_VISIBLE_DEVICES')}, granted "
                                f"{[d.uuid for d in devices]}")
            for d in devices:
                booked[d.uuid] = booked.get(d.uuid, 0) + d.used_memory_mib
    finally:
        client.close()
    problems += [f"{uuid} booked {mib} MiB > {CARD_MIB}" for uuid, mib in booked.items()
                 if mib > CARD_MIB]
    return problems


def unresolvable_events(bed: Any, names: list[str]) -> int:
    from lightkube.resources.core_v1 import Event

    client = bed.client()
    try:
        return sum(int(e.count or 1) for e in client.list(Event, namespace="default")
                   if e.involvedObject.name in names and UNRESOLVABLE in (e.message or ""))
    finally:
        client.close()


class SpecChurn:
    """Other CDI spec files rewritten ``hz`` times a second in the node's spec directory
    (temporary file, then rename, as any writer does): each rewrite makes containerd's
    CDI cache rescan the whole directory, as a busy node's other writers (DRA drivers,
    hami's own spec writes and sweeps) do. 0: off."""

    def __init__(self, bed: Any, hz: float, files: int = 8) -> None:
        self.dir = bed.node.cdi_dir
        self.hz = hz
        self.files = files
        self.writes = 0
        self._stop = threading.Event()
        if hz > 0:
            threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        k = 0
        while not self._stop.wait(1.0 / self.hz):
            k = (k + 1) % self.files
            doc = {"cdiVersion": "0.6.0", "kind": "churn.example.com/dev",
                   "devices": [{"name": f"d{k}", "containerEdits": {"env": [f"CHURN={k}"]}}]}
            path = self.dir / f"churn-{k}.json"
            tmp = self.dir / f".churn-{k}.tmp"
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)
            self.writes += 1

    def stop(self) -> int:
        self._stop.set()
        for k in range(self.files):
            (self.dir / f"churn-{k}.json").unlink(missing_ok=True)
        return self.writes


def delete_pods(bed: Any) -> None:
    from lightkube.resources.core_v1 import Pod

    from hami.testing.controlplane import wait_until

    client = bed.client()
    try:
        for p in client.list(Pod, namespace="default"):
            client.delete(Pod, p.metadata.name, namespace="default", grace_period=0)
        wait_until(lambda: not list(client.list(Pod, namespace="default")), timeout_s=120,
                   what="pods deleted")
    finally:
        client.close()


def burst(bed: Any, mode: str, n: int, prefix: str, churn_hz: float = 0.0) -> dict[str, Any]:
    """One burst of ``n`` pods named ``<prefix>-<i>`` on ``bed``; figures and checks."""
    from lightkube import codecs

    assert bed.cp is not None and bed.node is not None
    gpu = mode != "vanilla"
    names = [f"{prefix}-{i:02d}" for i in range(n)]
    objs = [codecs.from_dict(pod_manifest(nm, i, gpu)) for i, nm in enumerate(names)]
    procs = {c.name: c.process.pid for c in bed.cp._components  # noqa: SLF001
             if c.process.poll() is None}
    procs.update({c.name: c.process.pid for c in bed.node._components  # noqa: SLF001
                  if c.process.poll() is None})
    if bed.scheduler is not None:
        procs["hami-scheduler"] = bed.scheduler.process.pid
    logs = {k: LogTail(p) for k, p in {
        "hami": bed.scheduler.log_path if bed.scheduler else Path("/nonexistent"),
        "plugin": bed.plugin.log_path, "kubelet": bed.node.log_dir / "kubelet.log",
        "containerd": bed.node.log_dir / "containerd.log"}.items()}
    clock = PodClock(bed)
    client = bed.client()
    time.sleep(1.0)  # the watch is open
    kube_before = kubelet_metrics(bed)
    api_before = api_requests(bed.cp)
    meter = CpuMeter(procs)
    meter.start()
    load_before = os.getloadavg()[0]
    churn = SpecChurn(bed, churn_hz)
    t0 = time.monotonic()
    created: dict[str, float] = {}

    def create(obj: Any) -> None:
        created[obj.metadata.name] = time.monotonic()
        client.create(obj)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, objs))
    clock.wait_done(names, timeout_s=600)
    running_s = max(clock.running_at[x] for x in names) - t0
    churn_writes = churn.stop()
    api_after = settle(bed.cp)
    cpu = meter.stop(n)
    clock.stop()
    client.close()
    kube = delta(kube_before, kubelet_metrics(bed))
    lines = {k: t.lines() for k, t in logs.items()}
    result: dict[str, Any] = {
        "mode": mode, "pods": n, "cdi_churn_writes": churn_writes, "pods_per_s_to_running": round(n / running_s, 2),
        "seconds_to_running": round(running_s, 1),
        "create_to_bound_ms": quantiles_ms([clock.bound_at[x] - created[x] for x in names]),
        "create_to_running_ms": quantiles_ms([clock.running_at[x] - created[x]
                                              for x in names]),
        "api_per_pod": per_pod(api_before, api_after, n),
        "cpu_ms_per_pod": cpu,
        "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "kubelet_allocate_calls": kube.get(
            'kubelet_device_plugin_alloc_duration_seconds_count{resource_name="nvidia.com/gpu"}',
            0.0),
        "container_start_errors": {k.split("{", 1)[1].rstrip("}"): v for k, v in kube.items()
                                   if k.startswith("kubelet_started_containers_errors_total")},
        "unresolvable_cdi": {
            "events": unresolvable_events(bed, names),
            "kubelet_log": sum(UNRESOLVABLE in ln for ln in lines["kubelet"]),
            "containerd_log": sum(UNRESOLVABLE in ln for ln in lines["containerd"])},
    }
    if gpu:
        bind_ms = field_values(lines["hami"], "bind", "took_ms", prefix)
        wait_ms = field_values(lines["hami"], "bind", "lock_wait_ms", prefix)
        result.update({
            "hami_binds": len(bind_ms),
            "hami_bind_ms": quantiles_ms([v / 1000 for v in bind_ms]),
            "hami_lock_wait_ms": quantiles_ms([v / 1000 for v in wait_ms]),
            "prestart_served": sum("PreStartContainer:" in ln and "served" in ln
                                   for ln in lines["plugin"]),
            "prestart_failed": sum("PreStartContainer" in ln and "failed" in ln
                                   for ln in lines["plugin"]),
            "allocate_failed": sum("Allocate failed" in ln for ln in lines["plugin"]),
        })
    result["problems"] = check(bed, names, gpu)
    return result


def run_mode(mode: str, pods: int, rounds: int, vanilla: bool,
             libvgpu_build: Path | None, churn_hz: float = 0.0) -> list[dict[str, Any]]:
    from hami.testing.gpubed import GpuBed, default_inventory

    bed = GpuBed(inventory=default_inventory(GPUS, CARD_MIB),
                 plugin_args=CDI_ARGS if mode == "cdi" else (), libvgpu_build=libvgpu_build)
    results = []
    t0 = time.monotonic()
    with bed:
        start_s = time.monotonic() - t0
        for r in range(rounds):
            if vanilla:
                out = burst(bed, "vanilla", pods, f"v{r}")
                out.update(bed_start_s=round(start_s, 1), round=r)
                print(json.dumps(out), flush=True)
                results.append(out)
                delete_pods(bed)
            out = burst(bed, mode, pods, f"{'l' if mode == 'node-lock' else 'c'}{r}", churn_hz)
            out.update(bed_start_s=round(start_s, 1), round=r)
            print(json.dumps(out), flush=True)
            results.append(out)
            delete_pods(bed)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pods", type=int, default=24, help="pods per burst")
    parser.add_argument("--rounds", type=int, default=1, help="bursts per bed")
    parser.add_argument("--modes", nargs="+", choices=("node-lock", "cdi"),
                        default=["node-lock", "cdi"])
    parser.add_argument("--no-vanilla", action="store_true",
                        help="skip the non-GPU reference burst")
    parser.add_argument("--libvgpu-build", type=Path, default=None,
                        help="libvgpu's build directory (default: native/libvgpu/build)")
    parser.add_argument("--cdi-churn-hz", type=float, default=0.0,
                        help="rewrite other CDI spec files this often during GPU bursts")
    args = parser.parse_args()
    for i, mode in enumerate(args.modes):
        run_mode(mode, args.pods, args.rounds, vanilla=(i == 0 and not args.no_vanilla),
                 libvgpu_build=args.libvgpu_build, churn_hz=args.cdi_churn_hz)


if __name__ == "__main__":
    main()
