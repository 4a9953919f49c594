"""What the vendor backends share: a base class with HAMi's defaults, resource parsing,
user filter annotations, and the adapter that runs the core NVIDIA ``Fit`` for vendors whose
rules are the same (HAMi v2.10: Hygon DCU, Iluvatar, ... "NVIDIA-like Fit").

The core :func:`hami.core.fit.fit_container` hard-codes two NVIDIA facts: the request type
must be ``NVIDIA`` and the user's type filters are ``nvidia.com/use-gputype``. The adapter
:func:`generic_fit` feeds it masked copies of the devices (type ``NVIDIA``, or a type the
pod options reject when this vendor's own filter rejects the card) so that the check order
and the reason counting stay exactly HAMi's (HAMi v2.10) and nothing is copied (a
``vendor``/``type_ok`` parameter of the core Fit would make the masking unnecessary).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami.api import names
from hami.core.codec import decode_node_devices_json, decode_pod_devices, encode_pod_devices
from hami.core.fit import DeviceState, FitOutcome, NodeOptions, PodOptions, fit_container
from hami.core.gowire import CodecError
from hami.core.model import (
    PERCENT_UNSET,
    ContainerDevice,
    ContainerDeviceRequest,
    ContainerDevices,
    DeviceInfo,
    PodSingleDevice,
)
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import quantity, resource_value
from hami.core.vendor import AdmissionError, FitContext, PatchContext, ResourceNames

INT32_MAX = 2**31 - 1
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_REJECT = "\x00rejected-by-vendor-filter"


def int_resource(container: Mapping[str, Any], name: str) -> int | None:
    """Integer value of resource ``name`` (limits, then requests); None when absent.

    Raises:
        AdmissionError: the value is not an exact integer quantity.
    """
    if not name:
        return None
    raw = resource_value(container, name)
    if raw is None:
        return None
    cname = container.get("name", "?")
    try:
        value = to_int_exact(quantity(raw))
    except QuantityError as exc:
        raise AdmissionError(f"{name} of container {cname}: {exc}") from None
    if value is None:
        raise AdmissionError(f"{name} of container {cname} must be an integer, got {raw!r}")
    if value < 0 or value > INT32_MAX:
        hint = (f" ({raw!r} is {value} units; device resources count plain numbers such as "
                "MiB, not bytes)" if isinstance(raw, str) and not raw.lstrip("-").isdigit()
                else "")
        raise AdmissionError(f"{name} of container {cname} must be between 0 and "
                             f"{INT32_MAX}, got {value}{hint}")
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


@dataclass(frozen=True, slots=True)
class Filters:
    """The pod annotation keys a vendor reads to include/exclude cards (HAMi v2.10).

    Empty keys mean the vendor has no such filter. Types match case-insensitively by
    substring (HAMi ``CheckType``), UUIDs exactly (``CheckUUID``).
    """

    use_type: str = ""
    nouse_type: str = ""
    use_uuid: str = ""
    nouse_uuid: str = ""
    numa_bind: str = ""

    def type_ok(self, anns: Mapping[str, str], device_type: str) -> bool:
        """``CheckType`` with this vendor's keys."""
        t = device_type.lower()
        use = [u.lower() for u in csv(anns.get(self.use_type)) if self.use_type]
        nouse = [u.lower() for u in csv(anns.get(self.nouse_type)) if self.nouse_type]
        if use and not any(u in t for u in use):
            return False
        return not any(n in t for n in nouse)

    def uuids(self, anns: Mapping[str, str]) -> tuple[frozenset[str], frozenset[str]]:
        """``(use, nouse)`` UUID sets."""
        use = frozenset(csv(anns.get(self.use_uuid))) if self.use_uuid else frozenset()
        nouse = frozenset(csv(anns.get(self.nouse_uuid))) if self.nouse_uuid else frozenset()
        return use, nouse

    def numa(self, anns: Mapping[str, str]) -> bool:
        """Go ``ParseBool`` true of the numa-bind annotation."""
        return bool(self.numa_bind) and anns.get(self.numa_bind, "") in _TRUE


def generic_fit(devices: Sequence[DeviceState], request: ContainerDeviceRequest,
                ctx: FitContext, filters: Filters, alloc_type: str) -> FitOutcome:
    """HAMi's NVIDIA ``Fit`` (HAMi v2.10) for another vendor, through the core implementation.

    ``devices`` are this vendor's devices, best first. The granted entries carry
    ``alloc_type`` (the CommonWord, or what the vendor's device plugin expects).
    """
    anns = ctx.pod_annotations
    masked = []
    for d in devices:
        kind = names.NVIDIA if filters.type_ok(anns, d.info.type) else names.NVIDIA + _REJECT
        info = replace(d.info, type=kind, mode=names.MODE_HAMI_CORE, mig_profiles=())
        masked.append(DeviceState(info, d.used_slots, d.used_memory_mib, d.used_cores))
    use, nouse = filters.uuids(anns)
    pod = PodOptions(nouse_types=(_REJECT.lower(),), use_uuids=use, nouse_uuids=nouse,
                     numa_bind=filters.numa(anns), gpu_policy=ctx.gpu_policy)
    outcome = fit_container(masked, replace(request, type=names.NVIDIA), pod,
                            NodeOptions(cordoned=ctx.cordoned), ctx.quota_ok)
    if not outcome.ok:
        return outcome
    granted = tuple(replace(c, type=alloc_type) for c in outcome.devices)
    return FitOutcome(True, granted)


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
    filters: Filters = Filters()

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
