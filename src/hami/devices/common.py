"""What the vendor backends share: a base class with HAMi's defaults, resource parsing,
user filter annotations (:class:`Filters`, the core's :class:`~hami.core.fit.CardFilters`),
and :func:`generic_fit`, the share-of-a-card ``Fit`` (:func:`hami.core.fit.fit_shares`,
NVIDIA's rules) run with the vendor's own filter keys for vendors whose rules are the same
(HAMi v2.10: Hygon DCU, Iluvatar, ... "NVIDIA-like Fit").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hami.core.codec import (
    MigAllocation,
    decode_node_devices_json,
    decode_pod_devices,
    encode_pod_devices,
)
from hami.core.fit import DeviceState, FitOutcome, NodeOptions, PodOptions, fit_shares
from hami.core.gowire import CodecError
from hami.core.model import (
    PERCENT_UNSET,
    ContainerDevice,
    ContainerDeviceRequest,
    ContainerDevices,
    DeviceInfo,
    PodSingleDevice,
)
from hami.core.model import CardFilters as Filters
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import INT32_MAX, RequestError, int_value, quantity, resource_value
from hami.core.vendor import (
    AdmissionError,
    EnvIsolation,
    FitContext,
    PatchContext,
    ResourceNames,
)


def int_resource(container: Mapping[str, Any], name: str) -> int | None:
    """Integer value of resource ``name`` (limits, then requests); None when absent
    (:func:`hami.core.request.int_value`, whose texts it keeps), within int32.

    Raises:
        AdmissionError: the value is not an exact integer quantity, or is negative or
            above 2^31-1.
    """
    if not name:
        return None
    try:
        value = int_value(container, name)
    except RequestError as exc:
        raise AdmissionError(str(exc)) from None
    if value is None:
        return None
    if value < 0 or value > INT32_MAX:
        raw = resource_value(container, name)
        hint = (f" ({raw!r} is {value} units; device resources count plain numbers such as "
                "MiB, not bytes)" if isinstance(raw, str) and not raw.lstrip("-").isdigit()
                else "")
        raise AdmissionError(f"{name} of container {container.get('name', '?')} must be "
                             f"between 0 and {INT32_MAX}, got {value}{hint}")
    return value


def in_limits(container: Mapping[str, Any], name: str) -> bool:
    """True when ``name`` is in the container's ``limits`` (HAMi's ``hasResource`` test)."""
    limits = (container.get("resources") or {}).get("limits") or {}
    return bool(name) and name in limits


def csv(value: str | None) -> tuple[str, ...]:
    """A comma list, entries trimmed, empties dropped; None/blank is ``()``."""
    if not value or not value.strip():
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())


def annotation(pod: Mapping[str, Any], key: str) -> str | None:
    """A pod (JSON mapping) annotation value, None when absent."""
    anns = (pod.get("metadata") or {}).get("annotations") or {}
    value = anns.get(key)
    return None if value is None else str(value)


def generic_fit(devices: Sequence[DeviceState], request: ContainerDeviceRequest,
                ctx: FitContext, filters: Filters, alloc_type: str) -> FitOutcome:
    """HAMi's NVIDIA ``Fit`` (HAMi v2.10) for another vendor: the core's share Fit over
    every one of this vendor's devices (no device-type match), with the vendor's filter
    keys ``filters`` (no MIG unless they say so).

    ``devices`` are this vendor's devices, best first. The granted entries carry
    ``alloc_type`` (the CommonWord, or what the vendor's device plugin expects).
    """
    pod = PodOptions.from_annotations(ctx.pod_annotations, ctx.gpu_policy, filters)
    if request.type != alloc_type:
        request = replace(request, type=alloc_type)
    return fit_shares(devices, request, pod, NodeOptions(cordoned=ctx.cordoned), ctx.quota_ok)


def whole_request(nums: int, kind: str) -> ContainerDeviceRequest:
    """A request for ``nums`` whole cards: all memory, all cores (exclusive)."""
    return ContainerDeviceRequest(nums=nums, type=kind, memory_mib=0, memory_percent=100,
                                  cores_percent=100)


def capacity(node: Mapping[str, Any], name: str) -> int:
    """Integer node capacity of ``name`` (``status.capacity``), 0 when absent/invalid."""
    raw = ((node.get("status") or {}).get("capacity") or {}).get(name)
    if raw is None:
        return 0
    try:
        value = to_int_exact(quantity(raw))
    except QuantityError:
        return 0
    return value if value is not None and value > 0 else 0


def node_name(node: Mapping[str, Any]) -> str:
    """``metadata.name`` of a node object."""
    return str((node.get("metadata") or {}).get("name") or "")


def node_annotations(node: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.annotations`` of a node object."""
    return (node.get("metadata") or {}).get("annotations") or {}


class BaseVendor:
    """HAMi's defaults for a vendor; each backend overrides what differs.

    Subclasses set the class attributes and implement :meth:`container_request`.
    """

    common_word: str = ""
    handshake_key: str = ""
    register_key: str | None = None
    lock_annotation: str | None = None
    to_allocate_key: str | None = None
    allocated_key: str = ""
    policy_neutral: bool = False
    fast_path: bool = False
    filters: Filters = Filters()
    env_isolation: EnvIsolation | None = None

    def resource_names(self) -> ResourceNames:
        raise NotImplementedError

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        raise NotImplementedError

    def request_for_pod(self, container: Mapping[str, Any],
                        pod_annotations: Mapping[str, str]) -> ContainerDeviceRequest | None:
        """Default: the pod's annotations do not change the request."""
        return self.container_request(container)

    @property
    def share_prefilter(self) -> bool:
        """True while the backend keeps the NVIDIA-like Fit (:func:`generic_fit`)."""
        return type(self).fit is BaseVendor.fit

    @property
    def scores_nodes(self) -> bool:
        """True when the backend overrides :meth:`score_node` or is policy-neutral."""
        return self.policy_neutral or type(self).score_node is not BaseVendor.score_node

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        """Default: validate the values; True when the count resource is in limits."""
        self.container_request(container)
        return in_limits(container, self.resource_names().count)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        """Default: the JSON register annotation (HAMi v2.10); ``()`` when absent."""
        if not self.register_key:
            return ()
        raw = node_annotations(node).get(self.register_key)
        if raw is None:
            return ()
        return decode_node_devices_json(raw, self.common_word)

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        """Default: the NVIDIA-like Fit, allocations typed with the CommonWord."""
        return generic_fit(devices, request, ctx, self.filters, self.common_word)

    def add_usage(self, state: DeviceState, device: ContainerDevice) -> None:
        """Default ``AddResourceUsage``: one slot, the memory and the cores."""
        state.used_slots += 1
        state.used_memory_mib += device.used_memory_mib
        state.used_cores += device.used_cores_percent

    def score_node(self, devices: Sequence[DeviceState], grant: Sequence[ContainerDevices],
                   ctx: FitContext) -> float:
        """Default ``ScoreNode``: 0."""
        return 0.0

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        """Default ``PatchAnnotations``: the pod device string (HAMi v2.10) under the vendor's
        to-allocate and allocated keys, only when some device was granted."""
        if not any(grant):
            return {}
        value = encode_pod_devices(grant)
        out = {self.allocated_key: value}
        if self.to_allocate_key:
            out[self.to_allocate_key] = value
        return out

    def decode_allocation(self, annotations: Mapping[str, str]) -> PodSingleDevice:
        """Read back this vendor's allocation from a pod's annotations (pod informer).

        Raises:
            CodecError: the annotation is malformed.
        """
        raw = annotations.get(self.allocated_key)
        return decode_pod_devices(raw) if raw else ()

    def decode_mig(self, annotations: Mapping[str, str]) -> tuple[MigAllocation, ...]:
        """Default: no MIG instances (the vendor's cards have no MIG mode)."""
        return ()


def memory_request(nums: int, kind: str, memory_mib: int, cores: int) -> ContainerDeviceRequest:
    """A share request: ``memory_mib`` 0 means the whole card (percentage 100)."""
    if memory_mib == 0:
        return ContainerDeviceRequest(nums, kind, 0, 100, cores)
    return ContainerDeviceRequest(nums, kind, memory_mib, PERCENT_UNSET, cores)


#: The most devices one vendor may synthesise from a node's capacity. Real nodes have at
#: most a few dozen accelerators; a larger figure is a broken capacity, and building
#: millions of devices would stall the scheduler.
MAX_CAPACITY_DEVICES = 256


def capacity_devices(node: Mapping[str, Any], count: int, vendor: str, kind: str,
                     memory_mib: int, cores: int = 100, split: int = 1,
                     uuid_word: str | None = None) -> tuple[DeviceInfo, ...]:
    """Devices synthesised from node capacity: ``<node>-<word>-<i>`` for ``i < count``.

    Raises:
        CodecError: ``count`` exceeds :data:`MAX_CAPACITY_DEVICES` (the node's devices of
            this vendor are then not registered, with that reason).
    """
    if count > MAX_CAPACITY_DEVICES:
        raise CodecError(f"node capacity gives {count} {vendor} devices; more than "
                         f"{MAX_CAPACITY_DEVICES} on one node is refused as a broken capacity")
    word = uuid_word or vendor
    name = node_name(node)
    return tuple(DeviceInfo(uuid=f"{name}-{word}-{i}", index=i, split_count=split,
                            memory_mib=memory_mib, cores_percent=cores, type=kind,
                            health=True, vendor=vendor) for i in range(count))


__all__ = [
    "AdmissionError",
    "BaseVendor",
    "CodecError",
    "Filters",
    "annotation",
    "capacity",
    "capacity_devices",
    "csv",
    "generic_fit",
    "in_limits",
    "int_resource",
    "memory_request",
    "node_annotations",
    "node_name",
    "whole_request",
]
