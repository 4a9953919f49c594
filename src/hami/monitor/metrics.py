"""Prometheus metrics of the vGPU monitor, HAMi's names, labels and units (HAMi-core 1.2).

Everything is computed at scrape time by :class:`MonitorCollector` from the loaded cache
files, the cached pod list and (when present) NVML. Every family except
``hami_build_info`` carries the constant label ``zone="vGPU"``. Per-container families
(MIG info included) cover running containers only (:func:`hami.monitor.pods.container_running`),
and per-device series only GPUs granted to the container by its pod's allocation
annotation (:func:`hami.monitor.pods.container_grants`): the region's UUIDs are written
by the container and only pick which granted GPU each device index is.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go

from hami.deviceplugin.allocate import PodView
from hami.monitor.claims import ClaimLister, attribute
from hami.monitor.lister import ContainerLister
from hami.monitor.pods import container_grants, container_running, pod_finished
from hami.monitor.region import Region

log = logging.getLogger(__name__)

ZONE = ("zone", "vGPU")
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
CTR_LABELS = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
LEGACY_CTR_LABELS = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")


@dataclass(frozen=True, slots=True)
class HostGpu:
    """One host GPU as NVML reports it; None = not supported."""

    index: int
    uuid: str
    name: str
    memory_used_bytes: int | None
    utilization_gpu: int | None
    utilization_memory: int | None


class HostGpuSource(Protocol):
    def gpus(self) -> list[HostGpu]: ...


class NoHostGpus:
    """No NVML: host families are empty."""

    def gpus(self) -> list[HostGpu]:
        return []


class NvmlHostGpus:
    """Host GPUs through ``pynvml``; errors give an empty list for that scrape."""

    def __init__(self) -> None:
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()

    def gpus(self) -> list[HostGpu]:
        nv = self.nv
        out = []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid, name = nv.nvmlDeviceGetUUID(h), nv.nvmlDeviceGetName(h)
                try:
                    used: int | None = int(nv.nvmlDeviceGetMemoryInfo(h).used)
                except nv.NVMLError:
                    used = None
                try:
                    u = nv.nvmlDeviceGetUtilizationRates(h)
                    ug: int | None = int(u.gpu)
                    um: int | None = int(u.memory)
                except nv.NVMLError:
                    ug = um = None
                out.append(HostGpu(i, _s(uuid), _s(name), used, ug, um))
        except nv.NVMLError as exc:
            log.warning("NVML: %s", exc)
        return out


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def metric_uuid(uuid: str) -> str | None:
    """The ``device_uuid`` label: first 40 characters; None when invalid (empty, or not
    valid UTF-8 — the reader decodes with replacement characters)."""
    if not uuid:
        return None
    head = uuid[:40]
    return None if "\ufffd" in head else head


def module_bytes(region: Region, i: int) -> int:
    return sum(p.devices[i].module_bytes for p in region.active_procs())


def build_info_family(version: str) -> Family:
    g = Family("hami_build_info", "hami build information",
               ["version", "revision", "build_date", "go_version", "compiler", "platform"])
    g.add_metric([version, "", "", f"python{sys.version.split()[0]}",
                  platform.python_implementation(), f"{sys.platform}/{platform.machine()}"], 1)
    return g


class Family:
    """A gauge family being built: name, help, label names, rows of (values, value)."""

    __slots__ = ("name", "doc", "labels", "rows")

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self.rows: list[tuple[Sequence[str], float]] = []

    def add_metric(self, values: Sequence[str], value: float) -> None:
        self.rows.append((values, value))

    def to_prometheus(self) -> GaugeMetricFamily:
        g = GaugeMetricFamily(self.name, self.doc, labels=list(self.labels))
        for values, value in self.rows:
            g.add_metric(list(values), value)
        return g


def floatToGoString(value: float) -> str:  # noqa: N802 - prometheus_client's name
    return str(_float_to_go(value))  # type: ignore[no-untyped-call]


def _escape_value(v: str) -> str:
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return v


def render_text(families: Sequence[Family]) -> bytes:
    """Prometheus text format 0.0.4, byte-identical to ``prometheus_client``'s
    ``generate_latest`` for these gauge families (labels sorted by name), ~5x faster."""
    out: list[str] = []
    memo: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
    for f in families:
        doc = f.doc.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {f.name} {doc}\n# TYPE {f.name} gauge\n")
        order = sorted(range(len(f.labels)), key=lambda i: f.labels[i])
        names = tuple(f.labels[i] for i in order)
        pairs = tuple(zip(names, order, strict=True))
        name = f.name
        for values, value in f.rows:
            if names:
                key = (names, tuple(values))
                lab = memo.get(key)
                if lab is None:  # the same series labels recur across families
                    lab = ",".join(f'{n}="{_escape_value(values[i])}"' for n, i in pairs)
                    memo[key] = lab
                out.append(f"{name}{{{lab}}} {floatToGoString(value)}\n")
            else:
                out.append(f"{name} {floatToGoString(value)}\n")
    return "".join(out).encode()


class MonitorCollector(Collector):
    """Scrape-time collector. ``pods`` returns the cached pods labelled for this node;
    ``claims`` (DRA mode) the node's claim regions, attributed to ``node_pods`` (every
    pod of the node: DRA pods carry no ``hami.io/vgpu-node`` label) with
    :func:`hami.monitor.claims.attribute`, under the same family names."""

    def __init__(self, node: str, lister: ContainerLister, pods: Callable[[], Sequence[PodView]],
                 host: HostGpuSource | None = None, legacy: bool = False,
                 version: str = "0.1.0", clock: Callable[[], float] = time.time,
                 claims: ClaimLister | None = None,
                 node_pods: Callable[[], Sequence[PodView]] | None = None) -> None:
        self.node = node
        self.lister = lister
        self.pods = pods
        self.claims = claims
        self.node_pods = node_pods or pods
        self.host = host or NoHostGpus()
        self.legacy = legacy
        self.version = version
        self.clock = clock

    def _g(self, name: str, doc: str, labels: Sequence[str]) -> Family:
        return Family(name, doc, [*labels, ZONE[0]])

    def families(self) -> list[Family]:
        """Every family of one scrape, in exposition order."""
        return [build_info_family(self.version), *self._host(), *self._containers()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for f in self.families():
            yield f.to_prometheus()

    def render(self) -> bytes:
        """The scrape body (same bytes as ``generate_latest`` over this collector)."""
        return render_text(self.families())

    def _host(self) -> Iterator[Family]:
        host_labels = ("node", "device_index", "device_uuid", "device_type")
        mem = self._g("hami_host_gpu_memory_used_bytes", "GPU device memory used (bytes)", host_labels)
        util = self._g("hami_host_gpu_utilization_ratio", "GPU utilization (0-100)", host_labels)
        mc = self._g("hami_host_gpu_memory_controller_utilization_ratio",
                     "GPU memory controller utilization (0-100)",
                     ("device_index", "device_uuid", "device_type"))
        leg = ("nodeid", "deviceidx", "deviceuuid", "devicetype")
        lmem = self._g("HostGPUMemoryUsage", "GPU device memory usage", leg)
        lutil = self._g("HostCoreUtilization", "GPU core utilization", leg)
        for g in self.host.gpus():
            dtype = f"NVIDIA-{g.name}"
            lv = [self.node, str(g.index), g.uuid, dtype]
            if g.memory_used_bytes is not None:
                mem.add_metric([*lv, ZONE[1]], g.memory_used_bytes)
                lmem.add_metric([*lv, ZONE[1]], g.memory_used_bytes)
            if g.utilization_gpu is not None:
                util.add_metric([*lv, ZONE[1]], g.utilization_gpu)
                lutil.add_metric([*lv, ZONE[1]], g.utilization_gpu)
            if g.utilization_memory is not None:
                mc.add_metric([str(g.index), g.uuid, dtype, ZONE[1]], g.utilization_memory)
        yield from (mem, util, mc)
        if self.legacy:
            yield from (lmem, lutil)

    def _containers(self) -> Iterator[Family]:
        fams = {
            "used": self._g("hami_vgpu_memory_used_bytes",
                            "vGPU device memory used by the container (bytes)", CTR_LABELS),
            "limit": self._g("hami_vgpu_memory_limit_bytes",
                             "vGPU device memory limit of the container (bytes)", CTR_LABELS),
            "cmem": self._g("hami_container_device_memory_bytes",
                            "Container device memory usage (bytes)", CTR_LABELS),
            "cutil": self._g("hami_container_device_utilization_ratio",
                             "Container device SM utilization (0-100)", CTR_LABELS),
            "ctx": self._g("hami_vgpu_memory_context_bytes", "Context memory (bytes)", CTR_LABELS),
            "mod": self._g("hami_vgpu_memory_module_bytes", "Module memory (bytes)", CTR_LABELS),
            "buf": self._g("hami_vgpu_memory_buffer_bytes", "Buffer memory (bytes)", CTR_LABELS),
            "lk": self._g("hami_container_last_kernel_elapsed_seconds",
                          "Seconds since the container's last kernel launch", CTR_LABELS),
            "mig": self._g("hami_mig_device_info", "MIG instance of a container",
                           ("namespace", "pod", "container", "vdevice_index", "device_uuid",
                            "mig_uuid", "profile", "gpu_instance_id", "compute_instance_id")),
        }
        leg = {
            "used": self._g("vGPU_device_memory_usage_in_bytes", "vGPU device usage",
                            LEGACY_CTR_LABELS),
            "limit": self._g("vGPU_device_memory_limit_in_bytes", "vGPU device limit",
                             LEGACY_CTR_LABELS),
            "desc": self._g("Device_memory_desc_of_container", "Container device memory description",
                            (*LEGACY_CTR_LABELS, "context", "module", "data", "offset")),
            "util": self._g("Device_utilization_desc_of_container",
                            "Container device utilization description", LEGACY_CTR_LABELS),
            "lk": self._g("Device_last_kernel_of_container", "Container device last kernel description",
                          LEGACY_CTR_LABELS),
            "mig": self._g("MigInfo", "MIG device information for container",
                           (*LEGACY_CTR_LABELS, "instanceid")),
        }
        regions = self.lister.read_all()
        now = int(self.clock())
        z = ZONE[1]
        for pod in self.pods():
            if pod_finished(pod):
                continue
            names = [c.name for c in pod.containers]
            grants = container_grants(pod)
            for ctr in pod.long_running():
                entry = regions.get(f"{pod.uid}_{ctr.name}")
                if entry is None or not container_running(pod, ctr.name):
                    continue
                self._region_series(fams, leg, (pod.namespace, pod.name, ctr.name), entry[1],
                                    grants[ctr.name].uuids, now)
            for m in mig_entries(pod):
                idx = m.get("containerIndex", -1)
                if (not isinstance(idx, int) or not 0 <= idx < len(names)
                        or not container_running(pod, names[idx])):
                    continue
                base = [pod.namespace, pod.name, names[idx], str(m.get("deviceIndex", 0)),
                        str(m.get("gpuUUID", ""))]
                fams["mig"].add_metric([*base, str(m["migUUID"]), str(m.get("profile", "")),
                                        str(m["gpuInstanceID"]), str(m["computeInstanceID"]), z], 1)
                if self.legacy:
                    leg["mig"].add_metric([*base, str(m["gpuInstanceID"]), z], 1)
        if self.claims is not None:
            node_pods = self.node_pods()
            for _, region, owner in self.claims.read_all().values():
                use = attribute(owner, node_pods)
                if use is not None:
                    self._region_series(fams, leg, (use.pod.namespace, use.pod.name,
                                                    use.container_label), region, use.uuids, now)
        yield from fams.values()
        if self.legacy:
            yield from leg.values()

    def _region_series(self, fams: dict[str, Family], leg: dict[str, Family],
                       who: tuple[str, str, str], region: Region, granted: Sequence[str],
                       now: int) -> None:
        """Per-device series of one region for ``who`` = (namespace, pod, container):
        only devices whose region UUID is in ``granted`` (a container cannot label
        another GPU)."""
        z = ZONE[1]
        for i in range(region.device_count):
            if region.uuids[i] not in granted:
                continue
            uuid = metric_uuid(region.uuids[i])
            if uuid is None:
                continue
            lv = [*who, str(i), uuid, z]
            total = region.used_memory_bytes(i)
            ctx, mod, buf = region.context_bytes(i), module_bytes(region, i), region.data_bytes(i)
            sm = region.sm_util_percent(i)
            fams["used"].add_metric(lv, total)
            fams["limit"].add_metric(lv, region.limit_bytes[i])
            fams["cmem"].add_metric(lv, total)
            fams["cutil"].add_metric(lv, sm)
            fams["ctx"].add_metric(lv, ctx)
            fams["mod"].add_metric(lv, mod)
            fams["buf"].add_metric(lv, buf)
            if region.last_kernel_time > 0:
                fams["lk"].add_metric(lv, max(now - region.last_kernel_time, 0))
            if self.legacy:
                leg["used"].add_metric(lv, total)
                leg["limit"].add_metric(lv, region.limit_bytes[i])
                off = total - ctx - mod - buf
                leg["desc"].add_metric([*lv[:5], str(ctx), str(mod), str(buf), str(off), z], total)
                leg["util"].add_metric(lv, sm)
                if region.last_kernel_time > 0:
                    leg["lk"].add_metric(lv, max(now - region.last_kernel_time, 0))


def mig_entries(pod: PodView) -> list[dict[str, Any]]:
    """Complete entries (migUUID, gpuInstanceID, computeInstanceID set) of
    ``hami.io/vgpu-mig-allocations``; malformed JSON gives []."""
    raw = pod.annotations.get(MIG_ALLOCATIONS)
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return []
    if not isinstance(data, list):
        return []
    return [m for m in data if isinstance(m, dict) and m.get("migUUID")
            and m.get("gpuInstanceID") is not None and m.get("computeInstanceID") is not None]
