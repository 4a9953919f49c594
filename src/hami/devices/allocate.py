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
from typing import Protocol

import numpy as np

from hami.core.codec import ScoringWeights
from hami.core.fit import NODE_INSUFFICIENT_DEVICE, DeviceState, PodOptions, QuotaCheck
from hami.core.model import ContainerDevices, PodSingleDevice
from hami.core.score import order_devices
from hami.core.vendor import FitContext, Vendor
from hami.core.vendors import PodDeviceRequests

DEVICE_TYPE_NOT_FOUND = "Device type not found"


class QuotaSource(Protocol):
    """What the fit needs of a quota ledger (:class:`hami.core.vendor_quota.VendorQuota`)."""

    def fit_check(self, namespace: str, vendor: str, placed: Sequence[ContainerDevices],
                  n_init: int, position: int) -> QuotaCheck | None:
        """The fit-time check for one container of one vendor, None when unlimited."""
        ...


POLICY_NEUTRAL_WEIGHT = 10000.0


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
    they are not modified. ``quota`` (a :class:`hami.core.vendor_quota.VendorQuota`) adds
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
