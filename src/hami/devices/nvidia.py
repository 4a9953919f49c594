"""NVIDIA as a :class:`~hami.core.vendor.Vendor` (CommonWord ``NVIDIA``): its requests and
its webhook mutation (HAMi v2.10 ``GenerateResourceRequests`` and ``MutateAdmission`` of
the NVIDIA device) and its settings (:class:`NvidiaConfig`, the ``nvidia:`` section of
the device config), reached by the core only through the registry; shells read the
settings with :func:`settings`.

Deliberate divergence from HAMi: where HAMi silently turns a malformed value into an
*empty* request (``nvidia.com/gpumem: 16Gi`` makes the container ask for no GPU at all,
so it runs unconfined), we raise :class:`~hami.core.request.RequestError` with a message
(the backend methods raise it as :class:`~hami.core.vendor.AdmissionError`, same text).
The webhook turns that into a denial, the extender into a filter error; nothing is
scheduled by accident. Likewise a ``gpumem-percentage`` of 101 or 2^32+50, which HAMi
accepts and leaves Pending with a misleading reason (field case B09), is denied at
admission with a message naming the container, the resource and the valid range.

The share Fit (slots, memory, cores, type and UUID filters, NUMA, MIG) is the core's
vendor-neutral :func:`hami.core.fit.fit_shares`, run with NVIDIA's filter keys
(:data:`CARD_FILTERS`), as the share-table vendors run it with theirs; node devices use
the core's codec of HAMi's register annotation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from hami.api import names
from hami.core import isolation
from hami.core.codec import (
    MigAllocation,
    decode_mig_allocations,
    decode_node_devices,
    encode_mig_allocations,
    encode_pod_devices,
)
from hami.core.config import ConfigError, SchedulerConfig
from hami.core.fit import (
    DeviceState,
    FitOutcome,
    NodeOptions,
    PodOptions,
    fit_shares,
    of_type,
)
from hami.core.model import (
    PERCENT_UNSET,
    CardFilters,
    ContainerDeviceRequest,
    DeviceInfo,
    PodSingleDevice,
)
from hami.core.quantity import QuantityError, to_int_exact
from hami.core.request import INT32_MAX, RequestError, int_value, quantity, resource_value
from hami.core.vendor import (
    AdmissionError,
    EnvIsolation,
    FitContext,
    PatchContext,
    ResourceNames,
)
from hami.devices.common import BaseVendor, node_annotations

#: NVIDIA's card filters (HAMi v2.10): type and UUID lists, NUMA binding, the card-mode
#: filter, its card-pair topology scores; its cards may be in MIG mode.
CARD_FILTERS = CardFilters(use_type=names.USE_GPUTYPE, nouse_type=names.NOUSE_GPUTYPE,
                           use_uuid=names.USE_GPUUUID, nouse_uuid=names.NOUSE_GPUUUID,
                           numa_bind=names.NUMA_BIND, mode=names.VGPU_MODE, mig=True,
                           node_scores=names.NODE_SCORE)


@dataclass(frozen=True, slots=True)
class NvidiaConfig:
    """The ``nvidia:`` section of HAMi's device config (chart defaults, HAMi v2.10).

    Resource names may be renamed by the operator (e.g. ``hami.io/gpu``); every request
    parser and the webhook read them from here. ``default_memory_mib`` 0 means "the
    whole card" for a container that gives neither memory nor percentage.
    """

    resource_count_name: str = names.RESOURCE_COUNT
    resource_memory_name: str = names.RESOURCE_MEMORY
    resource_memory_percentage_name: str = names.RESOURCE_MEMORY_PERCENTAGE
    resource_core_name: str = names.RESOURCE_CORES
    resource_priority_name: str = names.RESOURCE_PRIORITY
    default_memory_mib: int = 0
    default_cores_percent: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1
    overwrite_env: bool = False
    gpu_core_policy: str = ""
    runtime_class_name: str = ""
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> NvidiaConfig:
        """Build from the YAML ``nvidia:`` mapping using HAMi's camelCase keys.

        Unknown keys are ignored (HAMi has more, e.g. ``migProfileAllowlist``).

        Raises:
            ConfigError: a known key holds a value of the wrong type or a negative number.
        """
        keymap = {
            "resourceCountName": "resource_count_name",
            "resourceMemoryName": "resource_memory_name",
            "resourceMemoryPercentageName": "resource_memory_percentage_name",
            "resourceCoreName": "resource_core_name",
            "resourcePriorityName": "resource_priority_name",
            "defaultMemory": "default_memory_mib",
            "defaultCores": "default_cores_percent",
            "defaultGPUNum": "default_gpu_num",
            "memoryFactor": "memory_factor",
            "overwriteEnv": "overwrite_env",
            "gpuCorePolicy": "gpu_core_policy",
            "runtimeClassName": "runtime_class_name",
            "deviceSplitCount": "device_split_count",
            "deviceMemoryScaling": "device_memory_scaling",
            "deviceCoreScaling": "device_core_scaling",
        }
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, attr in keymap.items():
            if key not in raw or raw[key] is None:
                continue
            values[attr] = _coerce(key, raw[key], str(types[attr]))
        return cls(**values)


def _coerce(key: str, value: Any, type_name: str) -> Any:
    if type_name == "str":
        if not isinstance(value, str):
            raise ConfigError(f"nvidia.{key} must be a string, got {value!r}")
        return value
    if type_name == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"nvidia.{key} must be true or false, got {value!r}")
        return value
    if type_name == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"nvidia.{key} must be a non-negative integer, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"nvidia.{key} must be a positive number, got {value!r}")
    return float(value)


def container_request(
    container: Mapping[str, Any], config: NvidiaConfig
) -> ContainerDeviceRequest | None:
    """One container's NVIDIA request, or ``None`` when it asks for no GPU (HAMi v2.10).

    Returns ``ContainerDeviceRequest(nums, "NVIDIA", memory_mib, memory_percent,
    cores_percent)``; memory is multiplied by ``memory_factor``. A percentage above 100
    is clamped to 100 and one of 0 or below counts as unset (field cases B09, B10), so
    that a container never books 0 MiB by accident.

    Raises:
        RequestError: a value is not an integer, is negative, or overflows int32.
    """
    cname = container.get("name", "?")
    nums = int_value(container, config.resource_count_name)
    if nums is None or nums == 0:
        return None
    if nums < 0 or nums > INT32_MAX:
        raise RequestError(f"{config.resource_count_name} of container {cname} must be "
                           f"between 1 and {INT32_MAX}, got {nums}")
    factor = max(config.memory_factor, 1)
    memory = int_value(container, config.resource_memory_name) or 0
    if memory < 0 or memory > INT32_MAX // factor:
        raw = resource_value(container, config.resource_memory_name)
        hint = (f" ({raw!r} is {memory} units; {config.resource_memory_name} counts MiB, "
                "e.g. 16384 for 16 GiB)" if isinstance(raw, str) and not raw.isdigit() else "")
        raise RequestError(f"{config.resource_memory_name} of container {cname} must be "
                           f"between 0 and {INT32_MAX // factor} MiB, got {memory}{hint}")
    memory *= factor
    percent = PERCENT_UNSET
    raw_percent = int_value(container, config.resource_memory_percentage_name)
    if raw_percent is not None and raw_percent > 0:
        percent = min(raw_percent, 100)
    if percent == PERCENT_UNSET and memory == 0:
        if config.default_memory_mib:
            memory = config.default_memory_mib
        else:
            percent = 100
    cores = int_value(container, config.resource_core_name)
    if cores is None:
        cores = config.default_cores_percent
    if cores < 0 or cores > INT32_MAX:
        raise RequestError(f"{config.resource_core_name} of container {cname} must be "
                           f"a non-negative percentage, got {cores}")
    return ContainerDeviceRequest(nums=nums, memory_mib=memory, memory_percent=percent,
                                  cores_percent=cores)


def _append_env(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    if not any(e.get("name") == name for e in env):
        env.append({"name": name, "value": value})


def _validate(container: Mapping[str, Any], config: NvidiaConfig) -> None:
    """Range checks on the GPU resources of one container (raises RequestError)."""
    cname = container.get("name", "?")
    for rname, upper in ((config.resource_memory_percentage_name, 100),
                         (config.resource_core_name, 100)):
        raw = resource_value(container, rname)
        if raw is None:
            continue
        try:
            value = to_int_exact(quantity(raw))
        except QuantityError:
            value = None
        if value is None or value < 0 or value > upper:
            raise RequestError(f"invalid {rname} value {raw} in container {cname}: "
                               f"must be an integer between 0 and {upper}")
    container_request(container, config)


def mutate_container(container: dict[str, Any], pod: Mapping[str, Any],
                     config: NvidiaConfig) -> bool:
    """HAMi's NVIDIA ``MutateAdmission`` for one container, in place (HAMi v2.10).

    Returns True when the container asks for NVIDIA devices (after the count has been
    added for a memory- or cores-only request).

    Raises:
        RequestError: a GPU value is malformed or out of range.
        QuantityError: the memory percentage is not a quantity.
    """
    _validate(container, config)
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if config.resource_priority_name in limits:
        _append_env(container, names.ENV_TASK_PRIORITY,
                    str(limits[config.resource_priority_name]))
    if config.gpu_core_policy and config.gpu_core_policy != "default":
        _append_env(container, names.ENV_CORE_POLICY, config.gpu_core_policy)
    has_resource = config.resource_count_name in limits
    extras = (config.resource_core_name, config.resource_memory_name,
              config.resource_memory_percentage_name)
    if not has_resource and any(r in limits for r in extras) and config.default_gpu_num > 0:
        limits[config.resource_count_name] = config.default_gpu_num
        resources["limits"] = limits
        container["resources"] = resources
        has_resource = True
    count_given = config.resource_count_name in limits or config.resource_count_name in requests
    cores_given = config.resource_core_name in limits or config.resource_core_name in requests
    if count_given and not cores_given and _is_exclusive(container, config):
        limits[config.resource_core_name] = 100
        resources["limits"] = limits
        container["resources"] = resources
        has_resource = True
    if config.overwrite_env and container_request(container, config) is None:
        isolation.hide_gpus(container)  # ours: also for nvidia.com/gpu: 0 (HAMi: key present)
    return has_resource


def _is_exclusive(container: Mapping[str, Any], config: NvidiaConfig) -> bool:
    percent = resource_value(container, config.resource_memory_percentage_name)
    if percent is not None:
        value = to_int_exact(quantity(percent))
        return value == 100
    if not config.resource_memory_name:
        return True
    return resource_value(container, config.resource_memory_name) is None


def env_isolation(config: NvidiaConfig) -> EnvIsolation:
    """What the isolation rules and the webhook read of NVIDIA's settings: the resources
    that make a GPU container (count, memory, memory percentage, cores; not priority),
    ``overwriteEnv``, ``runtimeClassName``, the priority resource and ``gpuCorePolicy``."""
    resources = tuple(n for n in (config.resource_count_name, config.resource_memory_name,
                                  config.resource_memory_percentage_name,
                                  config.resource_core_name) if n)
    return EnvIsolation(resources, config.overwrite_env, config.runtime_class_name,
                        config.resource_priority_name, config.gpu_core_policy)


class Nvidia(BaseVendor):
    """HAMi's NVIDIA backend (CommonWord ``NVIDIA``) over its settings ``config``."""

    common_word = names.NVIDIA
    handshake_key = names.NODE_HANDSHAKE
    register_key = names.NODE_REGISTER
    to_allocate_key = names.DEVICES_TO_ALLOCATE
    allocated_key = names.DEVICES_ALLOCATED
    filters = CARD_FILTERS
    #: The core serves NVIDIA's requests on its share fast path (its Fit is ``fit_shares``).
    fast_path = True

    def __init__(self, config: NvidiaConfig | None = None) -> None:
        self.config = config or NvidiaConfig()
        self.env_isolation = env_isolation(self.config)

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_count_name, c.resource_memory_name,
                             c.resource_core_name, max(c.memory_factor, 1),
                             others=(c.resource_memory_percentage_name,
                                     c.resource_priority_name))

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        try:
            return mutate_container(container, pod, self.config)
        except (RequestError, QuantityError) as exc:
            raise AdmissionError(str(exc)) from None

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        try:
            return container_request(container, self.config)
        except (RequestError, QuantityError) as exc:
            raise AdmissionError(str(exc)) from None

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        """The register annotation in either form (HAMi v2.10); ``()`` when absent.

        Raises:
            CodecError: the annotation is malformed (HAMi's texts).
        """
        raw = node_annotations(node).get(names.NODE_REGISTER)
        return () if raw is None else decode_node_devices(raw, names.NVIDIA)

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        """``PatchAnnotations``: the pod device string under
        ``hami.io/vgpu-devices-to-allocate`` and ``hami.io/vgpu-devices-allocated``, and
        the MIG instances ``ctx.mig`` (if any) under ``hami.io/vgpu-mig-allocations``, only
        when some GPU was granted (HAMi v2.10)."""
        if not any(grant):
            return {}
        value = encode_pod_devices(grant)
        out = {names.DEVICES_TO_ALLOCATE: value, names.DEVICES_ALLOCATED: value}
        if ctx.mig:
            out[names.MIG_ALLOCATIONS] = encode_mig_allocations(ctx.mig)
        return out

    def decode_mig(self, annotations: Mapping[str, str]) -> tuple[MigAllocation, ...]:
        """The MIG instances of ``hami.io/vgpu-mig-allocations`` (``()`` when absent).

        Raises:
            CodecError: the annotation is malformed.
        """
        return decode_mig_allocations(annotations.get(names.MIG_ALLOCATIONS, "") or "[]")

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        pod = PodOptions.from_annotations(ctx.pod_annotations, ctx.gpu_policy, self.filters)
        return fit_shares(of_type(devices, request.type), request, pod,
                          NodeOptions.from_annotations(ctx.node_annotations, self.filters.node_scores),
                          ctx.quota_ok)


def settings(config: SchedulerConfig) -> NvidiaConfig:
    """NVIDIA's settings in ``config``: those of its registry's ``NVIDIA`` backend (the
    shells' way to read resource names, split count and scaling), the chart defaults
    when NVIDIA is not registered."""
    backend = config.registry.get(names.NVIDIA)
    return backend.config if isinstance(backend, Nvidia) else NvidiaConfig()
