"""One pod, several vendors: requests, the per-node fit, the node score and the pod
annotations, consistently across vendors (HAMi v2.10 ``Resourcereqs``, step 4, HAMi v2.10).

* Containers are init containers first, then regular ones; each has a request per vendor.
* Init containers are fitted on fresh copies of the node usage; regular containers
  cumulatively on one copy (HAMi v2.10 steps 1-2). Within a container, vendors are fitted in
  CommonWord order (Go map order is random; any deterministic order is allowed).
* A vendor only ever sees its own devices (``DeviceInfo.vendor``), so a container gets
  only devices of the vendors it asked for.
* The allocation is one :data:`PodSingleDevice` per vendor with one entry per container
  (``()`` for containers without that vendor's devices): the padding is on the vendor
  key (the pre-``9e75c87f`` behaviour of HAMi v2.10, chosen deliberately: it keeps each
  vendor's string positional, so the device plugin maps entries to the right containers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hami.core.codec import ScoringWeights
from hami.core.fit import NODE_INSUFFICIENT_DEVICE, DeviceState, PodOptions, QuotaCheck
from hami.core.model import ContainerDeviceRequest, ContainerDevices, PodSingleDevice
from hami.core.score import order_devices
from hami.devices.ascend import Ascend
from hami.devices.protocol import FitContext, PatchContext, Vendor

DEVICE_TYPE_NOT_FOUND = "Device type not found"


class QuotaSource(Protocol):
    """What the fit needs of a quota ledger (:class:`hami.devices.quota.VendorQuota`)."""

    def fit_check(self, namespace: str, vendor: str, placed: Sequence[ContainerDevices],
                  n_init: int, position: int) -> QuotaCheck | None:
        """The fit-time check for one container of one vendor, None when unlimited."""
        ...
POLICY_NEUTRAL_WEIGHT = 10000.0


@dataclass(frozen=True, slots=True)
class PodDeviceRequests:
    """Per container (init first) the request of each vendor it asks for."""

    containers: tuple[Mapping[str, ContainerDeviceRequest], ...]
    n_init: int = 0

    @property
    def vendors(self) -> tuple[str, ...]:
        """CommonWords requested by any container, sorted."""
        return tuple(sorted({w for c in self.containers for w in c}))


def _containers(pod: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []), list(spec.get("containers") or [])


def pod_requests(registry: Mapping[str, Vendor], pod: Mapping[str, Any]) -> PodDeviceRequests:
    """Every container's requests of every registered vendor (``Resourcereqs``).

    Raises:
        hami.devices.protocol.AdmissionError: a vendor value is malformed.
    """
    anns = (pod.get("metadata") or {}).get("annotations") or {}
    init, app = _containers(pod)
    out = []
    for container in [*init, *app]:
        reqs: dict[str, ContainerDeviceRequest] = {}
        for word, vendor in sorted(registry.items()):
            if isinstance(vendor, Ascend):
                req = vendor.request_for_pod(container, anns)
            else:
                req = vendor.container_request(container)
            if req is not None and req.nums > 0:
                reqs[word] = req
        out.append(reqs)
    return PodDeviceRequests(tuple(out), len(init))


def mutate_pod(registry: Mapping[str, Vendor], pod: dict[str, Any]) -> bool:
    """HAMi v2.10 step 4: every vendor's ``MutateAdmission`` on every init then regular container,
    in place; returns ``hasResource`` (OR of all results).

    Raises:
        hami.devices.protocol.AdmissionError: from the first vendor that refuses a value.
    """
    init, app = _containers(pod)
    has = False
    for container in [*init, *app]:
        for _, vendor in sorted(registry.items()):
            has = vendor.mutate_admission(container, pod) or has
    return has


@dataclass(frozen=True, slots=True)
class NodeAllocation:
    """The fit of a whole pod on one node: per vendor the grant, or the failure reason."""

    ok: bool
    devices: Mapping[str, PodSingleDevice] = field(default_factory=dict)
    reason: str = ""
    score: float = 0.0


def default_node_score(devices: Sequence[DeviceState]) -> float:
    """``ComputeDefaultScore`` of the pre-existing usage over every vendor's devices
    (HAMi v2.10 step 3), float32: ``10 (Σused/Σcount + Σcores/Σtotal + Σmem/Σtotal)``."""
    f32 = np.float32
    count = sum(d.info.split_count for d in devices)
    cores = sum(d.info.cores_percent for d in devices)
    memory = sum(d.info.memory_mib for d in devices)
    if count == 0 or cores == 0 or memory == 0:
        return 0.0
    used = f32(sum(d.used_slots for d in devices)) / f32(count)
    ucores = f32(sum(d.used_cores for d in devices)) / f32(cores)
    umem = f32(sum(d.used_memory_mib for d in devices)) / f32(memory)
    return float(f32(10) * (used + ucores + umem))


def _copy(devices: Sequence[DeviceState]) -> list[DeviceState]:
    return [DeviceState(d.info, d.used_slots, d.used_memory_mib, d.used_cores)
            for d in devices]


def fit_pod(registry: Mapping[str, Vendor], requests: PodDeviceRequests,
            devices: Sequence[DeviceState], *, node_name: str = "",
            node_annotations: Mapping[str, str] | None = None,
            pod_annotations: Mapping[str, str] | None = None,
            gpu_policy: str = "spread", node_policy: str = "binpack",
            weights: ScoringWeights | None = None,
            quota: QuotaSource | None = None, namespace: str = "default") -> NodeAllocation:
    """Fit every container of a pod on one node across vendors (HAMi v2.10).

    ``devices`` are all devices of the node (every vendor) with their existing usage;
    they are not modified. ``quota`` (a :class:`hami.devices.quota.VendorQuota`) adds
    the fit-time quota check of every vendor (HAMi v2.10). The score is the node's pre-existing
    default score plus each
    granted vendor's ``ScoreNode`` (policy-neutral vendors x10000, x-10000 under spread).
    """
    node_anns = node_annotations or {}
    pod_anns = pod_annotations or {}
    weights = weights or ScoringWeights()
    options = PodOptions(gpu_policy=gpu_policy)
    n = len(requests.containers)
    grant: dict[str, list[ContainerDevices]] = {w: [() for _ in range(n)]
                                                for w in requests.vendors}
    app_state = _copy(devices)
    for pos, reqs in enumerate(requests.containers):
        state = _copy(devices) if pos < requests.n_init else app_state
        for word in sorted(reqs):
            vendor = registry.get(word)
            if vendor is None:
                return NodeAllocation(False, reason=DEVICE_TYPE_NOT_FOUND)
            req = reqs[word]
            mine = [d for d in state if d.info.vendor == word]
            if req.nums > len(mine):
                return NodeAllocation(False, reason=NODE_INSUFFICIENT_DEVICE)
            ordered = order_devices(mine, req, options, weights)
            earlier = tuple(grant[word][:pos])
            check = (quota.fit_check(namespace, word, earlier, requests.n_init, pos)
                     if quota is not None else None)
            ctx = FitContext(pod_anns, node_anns, node_name, gpu_policy, allocated=earlier,
                             quota_ok=check)
            outcome = vendor.fit(ordered, req, ctx)
            if not outcome.ok:
                return NodeAllocation(False, reason=outcome.reason)
            by_uuid = {d.info.uuid: d for d in mine}
            for dev in outcome.devices:
                target = by_uuid.get(dev.uuid)
                if target is None:
                    return NodeAllocation(False, reason=f'Device with UUID "{dev.uuid}" not '
                                          f"found on node {node_name} after Fit")
                vendor.add_usage(target, dev)
            grant[word][pos] = outcome.devices
    result = {w: tuple(g) for w, g in grant.items()}
    score = default_node_score(devices)
    base = _copy(devices)
    for word, pod_grant in result.items():
        vendor = registry[word]
        ctx = FitContext(pod_anns, node_anns, node_name, gpu_policy)
        extra = vendor.score_node([d for d in base if d.info.vendor == word], pod_grant, ctx)
        if vendor.policy_neutral:
            extra *= -POLICY_NEUTRAL_WEIGHT if node_policy == "spread" else POLICY_NEUTRAL_WEIGHT
        score += extra
    return NodeAllocation(True, result, score=score)


def pod_patch(registry: Mapping[str, Vendor], allocation: Mapping[str, PodSingleDevice],
              ctx: PatchContext) -> dict[str, str]:
    """The pod annotations of every vendor's ``PatchAnnotations`` (HAMi v2.10 step 8), merged.

    Raises:
        ValueError: two vendors write different values under one key (a config error:
            two vendors configured with the same keys).
    """
    out: dict[str, str] = {}
    for word in sorted(allocation):
        for key, value in registry[word].pod_annotations(allocation[word], ctx).items():
            if key in out and out[key] != value:
                raise ValueError(f"vendors disagree on pod annotation {key}")
            out[key] = value
    return out


def merge_allocation(allocation: Mapping[str, PodSingleDevice], n_containers: int
                     ) -> PodSingleDevice:
    """All vendors' grants as one :data:`PodSingleDevice` (container by container, vendors
    in CommonWord order). UUIDs are unique across vendors, so the usage ledger can charge
    this merged value exactly as it charges an NVIDIA-only pod (HAMi v2.10)."""
    merged: list[ContainerDevices] = [() for _ in range(n_containers)]
    for word in sorted(allocation):
        for pos, container in enumerate(allocation[word]):
            merged[pos] = merged[pos] + tuple(container)
    return tuple(merged)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One candidate node: its name, annotations and every vendor's devices with usage."""

    name: str
    devices: Sequence[DeviceState]
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Choice:
    """The filter's answer: the chosen node and allocation, or every node's reason."""

    node: str | None
    allocation: Mapping[str, PodSingleDevice] = field(default_factory=dict)
    score: float = 0.0
    failed: Mapping[str, str] = field(default_factory=dict)


def choose_node(registry: Mapping[str, Vendor], requests: PodDeviceRequests,
                nodes: Sequence[NodeView], *, pod_annotations: Mapping[str, str] | None = None,
                gpu_policy: str = "spread", node_policy: str = "binpack",
                weights: ScoringWeights | None = None, quota: QuotaSource | None = None,
                namespace: str = "default") -> Choice:
    """The multi-vendor filter over candidate nodes (HAMi v2.10 steps 5-7, HAMi v2.10): fit every
    node,
    then binpack takes the highest score and spread the lowest (ties: the first node)."""
    fits: list[tuple[float, int, str, NodeAllocation]] = []
    failed: dict[str, str] = {}
    for i, view in enumerate(nodes):
        out = fit_pod(registry, requests, view.devices, node_name=view.name,
                      node_annotations=view.annotations, pod_annotations=pod_annotations,
                      gpu_policy=gpu_policy, node_policy=node_policy, weights=weights,
                      quota=quota, namespace=namespace)
        if out.ok:
            key = -out.score if node_policy != "spread" else out.score
            fits.append((key, i, view.name, out))
        else:
            failed[view.name] = out.reason
    if not fits:
        return Choice(None, failed=failed)
    _, _, name, best = min(fits, key=lambda t: (t[0], t[1]))
    return Choice(name, best.devices, best.score)
