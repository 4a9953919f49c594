"""Hygon DCU (CommonWord ``DCU``).

Source (HAMi v2.10): (``hami.io/node-dcu-register``, legacy CSV form of HAMi v2.10; handshake
``hami.io/node-handshake-dcu``), (``hami.io/dcu-devices-…``), (``hygon:`` keys
including ``memoryFactor``), (type filters ``hygon.com/use|nouse-dcutype``, UUID filters
``hygon.com/use|nouse-gpuuuid``, NVIDIA-like Fit). Resource names are the HAMi defaults
``hygon.com/dcunum``, ``hygon.com/dcumem`` (MiB), ``hygon.com/dcucores`` (percent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.codec import decode_node_devices_legacy
from hami.core.model import ContainerDeviceRequest, DeviceInfo
from hami.core.vendor import ResourceNames
from hami.devices.common import (
    AdmissionError,
    BaseVendor,
    Filters,
    in_limits,
    int_resource,
    memory_request,
    node_annotations,
)

COMMON_WORD = "DCU"
REGISTER = "hami.io/node-dcu-register"
HANDSHAKE = "hami.io/node-handshake-dcu"
TO_ALLOCATE = "hami.io/dcu-devices-to-allocate"
ALLOCATED = "hami.io/dcu-devices-allocated"
FILTERS = Filters(use_type="hygon.com/use-dcutype", nouse_type="hygon.com/nouse-dcutype",
                  use_uuid="hygon.com/use-gpuuuid", nouse_uuid="hygon.com/nouse-gpuuuid")


@dataclass(frozen=True, slots=True)
class HygonConfig:
    """The ``hygon:`` section of the device config (HAMi v2.10)."""

    resource_count_name: str = "hygon.com/dcunum"
    resource_memory_name: str = "hygon.com/dcumem"
    resource_core_name: str = "hygon.com/dcucores"
    memory_factor: int = 1


class Hygon(BaseVendor):
    """Hygon DCU: NVIDIA-like shares of a card, legacy CSV node register."""

    common_word = COMMON_WORD
    handshake_key = HANDSHAKE
    register_key = REGISTER
    to_allocate_key = TO_ALLOCATE
    allocated_key = ALLOCATED
    filters = FILTERS

    def __init__(self, config: HygonConfig | None = None) -> None:
        self.config = config or HygonConfig()

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_count_name, c.resource_memory_name,
                             c.resource_core_name, max(c.memory_factor, 1))

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        cores = int_resource(container, self.config.resource_core_name)
        if cores is not None and cores > 100:
            raise AdmissionError(f"invalid {self.config.resource_core_name} value {cores} in "
                                 f"container {container.get('name', '?')}: must be 0..100")
        self.container_request(container)
        return in_limits(container, self.config.resource_count_name)

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        c = self.config
        nums = int_resource(container, c.resource_count_name)
        if not nums:
            return None
        factor = max(c.memory_factor, 1)
        memory = int_resource(container, c.resource_memory_name) or 0
        if memory > (2**31 - 1) // factor:
            raise AdmissionError(f"{c.resource_memory_name} of container "
                                 f"{container.get('name', '?')} overflows int32 after x{factor}")
        cores = int_resource(container, c.resource_core_name) or 0
        return memory_request(nums, COMMON_WORD, memory * factor, cores)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        raw = node_annotations(node).get(REGISTER)
        return () if raw is None else decode_node_devices_legacy(raw, COMMON_WORD)
