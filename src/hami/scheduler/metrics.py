"""Prometheus metrics of the scheduler (HAMi v2.10), on their own port.

Gauges are computed at scrape time from the engine's ledger and quota (HAMi's names,
labels and the constant ``zone="vGPU"`` label), in a private registry (no process or
Python metrics, as HAMi's private registry has no Go ones). In DRA mode
(``--dra-mode``) the per-GPU and per-pod gauges also carry what ResourceClaims hold of
the cards our ResourceSlices publish (:func:`hami.dra.usage.metric_rows` over the
scheduler's watched slices and claims), under the same names and labels. Added (HAMi has
none): histograms of filter and bind latency, ``hami_scheduler_filter_duration_seconds`` and
``hami_scheduler_bind_duration_seconds`` with an ``outcome`` label.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import hami
from hami.devices import nvidia

if TYPE_CHECKING:
    from hami.dra.usage import CardUse, PodUse
    from hami.scheduler.engine import Engine

MIB = 1 << 20
ZONE = "vGPU"
#: Buckets in seconds; filter decisions are sub-millisecond to tens of ms, binds include
#: several API calls and may wait for a node lock.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                   2.0, 5.0, 10.0, 30.0)


class DraSource(Protocol):
    """Where DRA mode's allocations come from (:class:`hami.dra.cache.DraObjects`)."""

    def metric_rows(self) -> tuple[list[CardUse], list[PodUse]] | None:
        """Per-card and per-pod use; None while not yet known."""


class _Card(NamedTuple):
    node: str
    uuid: str
    device_index: int
    type: str
    memory_mib: int
    cores_percent: int
    slots: int
    memory_used_mib: int
    cores_used_percent: int


class _Pod(NamedTuple):
    namespace: str
    node: str
    pod: str
    device_uuid: str
    memory_mib: int
    cores_percent: int


class SchedulerMetrics:
    """The registry, the two latency histograms (the engine's observer) and the
    scrape-time collector."""

    def __init__(self, legacy: bool = False) -> None:
        self.legacy = legacy
        self.registry = CollectorRegistry(auto_describe=True)
        self.filter_seconds = Histogram(
            "hami_scheduler_filter_duration_seconds",
            "Time to answer an extender /filter call, by outcome",
            ["outcome"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.bind_seconds = Histogram(
            "hami_scheduler_bind_duration_seconds",
            "Time to answer an extender /bind call (node lock, patch, Binding), by outcome",
            ["outcome"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.preemptions = Counter(
            "hami_scheduler_preemptions",
            "Preemptions started for GPU pods that fit nowhere, by outcome (evicted: every "
            "victim evicted; refused: an eviction was refused and the candidate dropped)",
            ["outcome"], registry=self.registry)
        self.preemption_victims = Counter(
            "hami_scheduler_preemption_victims", "Pods evicted by hami's preemption",
            registry=self.registry)
        self.preemptor_bound_seconds = Histogram(
            "hami_scheduler_preemptor_bound_seconds",
            "Time from a preempting pod's creation to its binding",
            buckets=(1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0),
            registry=self.registry)
        self._collector: _ClusterCollector | None = None

    def preemption(self, victims: int, refused: bool) -> None:
        self.preemptions.labels("refused" if refused else "evicted").inc()
        self.preemption_victims.inc(victims)

    def preemptor_bound(self, seconds: float) -> None:
        self.preemptor_bound_seconds.observe(seconds)

    def filter_done(self, seconds: float, outcome: str) -> None:
        self.filter_seconds.labels(outcome).observe(seconds)

    def bind_done(self, seconds: float, outcome: str) -> None:
        self.bind_seconds.labels(outcome).observe(seconds)

    def attach(self, engine: Engine) -> None:
        """Start reporting ``engine``'s ledger and quota."""
        self._collector = _ClusterCollector(engine, self.legacy)
        self.registry.register(self._collector)

    def attach_dra(self, source: DraSource) -> None:
        """Also report DRA allocations from ``source`` (after :meth:`attach`)."""
        if self._collector is not None:
            self._collector.dra = source


def _family(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=[*labels, "zone"])


class _ClusterCollector(Collector):
    def __init__(self, engine: Engine, legacy: bool = False) -> None:
        self.engine = engine
        self.legacy = legacy
        self.dra: DraSource | None = None
        self._cards: list[_Card] = []
        self._pod_rows: list[_Pod] = []

    def _rows(self) -> None:
        """This scrape's per-card and per-pod rows: the ledger's, then DRA mode's."""
        ledger = self.engine.state.ledger
        self._cards = [_Card(node, info.uuid, info.index, info.type, info.memory_mib,
                             info.cores_percent, slots, mem, cores)
                       for node in ledger.node_names()
                       for info, slots, mem, cores in ledger.device_usage(node)]
        self._pod_rows = [_Pod(entry.namespace, entry.node, entry.name, charge.uuid,
                               charge.memory_mib, charge.cores_percent)
                          for entry in ledger.pods() for charge in entry.charges if charge.uuid]
        dra = self.dra.metric_rows() if self.dra is not None else None
        if dra is not None:
            self._cards += [_Card(c.node, c.uuid, c.index, c.type, c.memory_mib,
                                  c.cores_percent, c.tasks, c.memory_used_mib,
                                  c.cores_used_percent) for c in dra[0]]
            self._pod_rows += [_Pod(p.namespace, p.node, p.pod, p.device_uuid, p.memory_mib,
                                    p.cores_percent) for p in dra[1]]

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily("hami_build_info", "hami build information",
                                  labels=["version", "revision", "build_date", "go_version",
                                          "compiler", "platform"])
        build.add_metric([hami.__version__, "",
                          "", platform.python_version(), "cpython",
                          f"{platform.system().lower()}/{platform.machine()}"], 1)
        yield build
        self._rows()
        yield from self._devices()
        yield from self._mig()
        yield from self._quotas()
        yield from self._pods()
        if self.legacy:
            yield from self._legacy()

    def _devices(self) -> Iterator[Metric]:
        dev = ["node", "device_uuid", "device_index", "device_type"]
        mem_limit = _family("hami_gpu_memory_limit_bytes", "GPU device memory limit", dev)
        core_limit = _family("hami_gpu_core_limit_ratio", "GPU device core limit", dev)
        mem_alloc = _family("hami_gpu_memory_allocated_bytes", "GPU device memory allocated",
                            ["node", "device_uuid", "device_index", "device_cores", "device_type"])
        shared = _family("hami_gpu_shared_count", "Number of tasks sharing the GPU", dev)
        core_alloc = _family("hami_gpu_core_allocated_ratio", "GPU cores allocated", dev)
        overview = _family("hami_node_gpu_overview", "GPU overview per node",
                           ["node", "device_uuid", "device_index", "device_cores",
                            "device_memory_limit", "device_type"])
        ratio = _family("hami_node_gpu_memory_allocated_ratio",
                        "Allocated share of GPU memory", dev)
        for c in self._cards:
            idx, z = str(c.device_index), ZONE
            labels = [c.node, c.uuid, idx, c.type, z]
            mem_limit.add_metric(labels, c.memory_mib * MIB)
            core_limit.add_metric(labels, c.cores_percent)
            mem_alloc.add_metric([c.node, c.uuid, idx, str(c.cores_percent), c.type, z],
                                 c.memory_used_mib * MIB)
            shared.add_metric(labels, c.slots)
            core_alloc.add_metric(labels, c.cores_used_percent)
            overview.add_metric([c.node, c.uuid, idx, str(c.cores_percent),
                                 str(c.memory_mib), c.type, z], c.memory_used_mib * MIB)
            if c.memory_mib > 0:
                ratio.add_metric(labels, c.memory_used_mib / c.memory_mib)
        yield from (mem_limit, core_limit, mem_alloc, shared, core_alloc, overview, ratio)

    def _mig(self) -> Iterator[Metric]:
        """``hami_node_gpu_mig_instance_info``: 1 per MIG reservation the device plugin has
        realised (MIG UUID, GPU and compute instance ids known), HAMi v2.10."""
        info = _family("hami_node_gpu_mig_instance_info", "MIG instance placed on a GPU",
                       ["node", "device_uuid", "device_index", "mig_uuid", "profile",
                        "gpu_instance_id", "compute_instance_id", "placement_start",
                        "placement_size"])
        state = self.engine.state
        for uid, allocations in state.mig.items():
            entry = state.ledger.pod(uid)
            node = state.ledger.node(entry.node) if entry is not None else None
            if node is None:
                continue
            index = {d.uuid: d.index for d in node.devices}
            for a in allocations:
                if a.runtime is None or a.gpu_uuid not in index:
                    continue
                info.add_metric([node.name, a.gpu_uuid, str(index[a.gpu_uuid]),
                                 a.runtime.mig_uuid, a.profile,
                                 str(a.runtime.gpu_instance_id),
                                 str(a.runtime.compute_instance_id),
                                 str(a.placement.start), str(a.placement.size), ZONE], 1)
        yield info

    def _legacy(self) -> Iterator[Metric]:
        """The pre-2.5 names HAMi still serves with ``--legacy-metrics`` (HAMi v2.10)."""
        dev = ["nodeid", "deviceuuid", "deviceidx", "devicetype"]
        fams = {
            "GPUDeviceMemoryLimit": _family("GPUDeviceMemoryLimit", "GPU device memory limit", dev),
            "GPUDeviceCoreLimit": _family("GPUDeviceCoreLimit", "GPU device core limit", dev),
            "GPUDeviceSharedNum": _family("GPUDeviceSharedNum", "Number of tasks sharing the GPU",
                                          dev),
            "GPUDeviceCoreAllocated": _family("GPUDeviceCoreAllocated", "GPU cores allocated",
                                              dev),
        }
        mem_alloc = _family("GPUDeviceMemoryAllocated", "GPU device memory allocated",
                            ["nodeid", "deviceuuid", "deviceidx", "devicecores", "devicetype"])
        overview = _family("nodeGPUOverview", "GPU overview per node",
                           ["nodeid", "deviceuuid", "deviceidx", "devicecores",
                            "devicememorylimit", "devicetype"])
        pct = _family("nodeGPUMemoryPercentage", "Allocated share of GPU memory",
                      ["nodeid", "deviceuuid", "deviceidx"])
        ledger = self.engine.state.ledger
        for c in self._cards:
            idx = str(c.device_index)
            labels = [c.node, c.uuid, idx, c.type, ZONE]
            fams["GPUDeviceMemoryLimit"].add_metric(labels, c.memory_mib * MIB)
            fams["GPUDeviceCoreLimit"].add_metric(labels, c.cores_percent)
            fams["GPUDeviceSharedNum"].add_metric(labels, c.slots)
            fams["GPUDeviceCoreAllocated"].add_metric(labels, c.cores_used_percent)
            mem_alloc.add_metric([c.node, c.uuid, idx, str(c.cores_percent), c.type, ZONE],
                                 c.memory_used_mib * MIB)
            overview.add_metric([c.node, c.uuid, idx, str(c.cores_percent), str(c.memory_mib),
                                 c.type, ZONE], c.memory_used_mib * MIB)
            if c.memory_mib > 0:
                pct.add_metric([c.node, c.uuid, idx, ZONE], c.memory_used_mib / c.memory_mib)
        yield from (*fams.values(), mem_alloc, overview, pct)
        mig = _family("nodeGPUMigInstance", "MIG instance placed on a GPU",
                      ["nodeid", "deviceuuid", "deviceidx", "migname"])
        state = self.engine.state
        for uid, allocations in state.mig.items():
            entry = ledger.pod(uid)
            node_entry = ledger.node(entry.node) if entry is not None else None
            if node_entry is None:
                continue
            index = {d.uuid: d.index for d in node_entry.devices}
            for a in allocations:
                if a.runtime is not None and a.gpu_uuid in index:
                    mig.add_metric([node_entry.name, a.gpu_uuid, str(index[a.gpu_uuid]),
                                    f"{a.profile}-{a.runtime.gpu_instance_id}", ZONE], 1)
        yield mig
        quota = _family("QuotaUsed", "Resource quota used", ["quotanamespace", "quotaName", "limit"])
        for ns, rname, lim, use in self._quota_rows():
            quota.add_metric([ns, rname, str(lim), ZONE], use)
        yield quota
        pod_labels = ["podnamespace", "nodename", "podname", "containeridx", "deviceuuid"]
        vmem = _family("vGPUMemoryAllocated", "vGPU memory allocated to a pod", pod_labels)
        vcore = _family("vGPUCoreAllocated", "vGPU cores allocated to a pod", pod_labels)
        for p in self._pod_rows:
            lab = [p.namespace, p.node, p.pod, "0", p.device_uuid, ZONE]
            vmem.add_metric(lab, p.memory_mib * MIB)
            vcore.add_metric(lab, p.cores_percent)
        yield from (vmem, vcore)

    def _quotas(self) -> Iterator[Metric]:
        used = _family("hami_resource_quota_used", "Resource quota used",
                       ["namespace", "quota_name", "limit"])
        limit = _family("hami_resource_quota_limit", "Resource quota limit",
                        ["namespace", "quota_name"])
        for ns, rname, lim, use in self._quota_rows():
            used.add_metric([ns, rname, str(lim), ZONE], use)
            limit.add_metric([ns, rname, ZONE], lim)
        yield from (used, limit)

    def _quota_rows(self) -> Iterator[tuple[str, str, int, int]]:
        """``(namespace, resource, limit, used)`` of every limited quota resource: NVIDIA's
        memory and cores, then every other vendor's (HAMi v2.10)."""
        names = nvidia.settings(self.engine.config)
        for ns, q in self.engine.state.quota.namespaces().items():
            for rname, lim, use in ((names.resource_memory_name, q.memory_limit_mib,
                                     q.memory_used_mib),
                                    (names.resource_core_name, q.cores_limit_percent,
                                     q.cores_used_percent)):
                if lim is not None:
                    yield ns, rname, lim, use
        vendor_quota = self.engine.state.vendor_quota
        if vendor_quota is not None:
            yield from vendor_quota.limited()

    def _pods(self) -> Iterator[Metric]:
        labels = ["namespace", "node", "pod", "container_index", "device_uuid"]
        mem = _family("hami_vgpu_memory_allocated_bytes", "vGPU memory allocated to a pod",
                      labels)
        cores = _family("hami_vgpu_core_allocated_ratio", "vGPU cores allocated to a pod", labels)
        for p in self._pod_rows:
            lab = [p.namespace, p.node, p.pod, "0", p.device_uuid, ZONE]
            mem.add_metric(lab, p.memory_mib * MIB)
            cores.add_metric(lab, p.cores_percent)
        yield from (mem, cores)
