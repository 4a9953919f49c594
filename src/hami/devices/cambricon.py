"""Cambricon MLU (CommonWord ``MLU``), dynamic SMLU sharing.

Source (HAMi v2.10): (own lock ``cambricon.com/dsmlu.lock``, RFC3339 value),
(``hami.io/cambricon-mlu-devices-…``), (``cambricon:`` resource names), (devices
synthesised from node capacity of the core resource, one device per 100 vcore; vmemory
unit 256 MiB; ``CAMBRICON_DSMLU_PROFILE`` = ``<idx>_<cores>_<mem/256>`` and
``CAMBRICON_DSMLU_ASSIGNED``). Resource names and the "vmlu > 1 means whole cards" rule
are HAMi's Cambricon guide; ``cambricon.com/use|nouse-mlutype`` likewise.

Our choices where HAMi is silent (see docs/dev/vendors-design.md): device UUID
``<node>-cambricon-mlu-<i>``, memory per device = memory capacity / devices (in 256 MiB
units), 100 share slots per device, ``CAMBRICON_DSMLU_ASSIGNED`` written ``false`` (the
device plugin flips it), one profile per granted device joined by ``,``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.model import ContainerDeviceRequest, DeviceInfo, PodSingleDevice
from hami.core.vendor import PatchContext, ResourceNames
from hami.devices.common import (
    AdmissionError,
    BaseVendor,
    Filters,
    capacity,
    capacity_devices,
    in_limits,
    int_resource,
    memory_request,
    whole_request,
)

COMMON_WORD = "MLU"
MEMORY_UNIT_MIB = 256
CORES_PER_DEVICE = 100
LOCK = "cambricon.com/dsmlu.lock"
HANDSHAKE = "hami.io/node-handshake-mlu"
TO_ALLOCATE = "hami.io/cambricon-mlu-devices-to-allocate"
ALLOCATED = "hami.io/cambricon-mlu-devices-allocated"
PROFILE = "CAMBRICON_DSMLU_PROFILE"
ASSIGNED = "CAMBRICON_DSMLU_ASSIGNED"
FILTERS = Filters(use_type="cambricon.com/use-mlutype", nouse_type="cambricon.com/nouse-mlutype")


@dataclass(frozen=True, slots=True)
class CambriconConfig:
    """The ``cambricon:`` section (HAMi v2.10)."""

    resource_count_name: str = "cambricon.com/vmlu"
    resource_memory_name: str = "cambricon.com/mlu.smlu.vmemory"
    resource_core_name: str = "cambricon.com/mlu.smlu.vcore"


class Cambricon(BaseVendor):
    """Cambricon dynamic SMLU."""

    common_word = COMMON_WORD
    handshake_key = HANDSHAKE
    lock_annotation = LOCK
    to_allocate_key = TO_ALLOCATE
    allocated_key = ALLOCATED
    filters = FILTERS

    def __init__(self, config: CambriconConfig | None = None) -> None:
        self.config = config or CambriconConfig()

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_count_name, c.resource_memory_name,
                             c.resource_core_name, memory_unit_mib=MEMORY_UNIT_MIB)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        cores = int_resource(container, self.config.resource_core_name)
        if cores is not None and cores > CORES_PER_DEVICE:
            raise AdmissionError(f"invalid {self.config.resource_core_name} value {cores} in "
                                 f"container {container.get('name', '?')}: must be 0..100")
        self.container_request(container)
        return in_limits(container, self.config.resource_count_name)

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        c = self.config
        nums = int_resource(container, c.resource_count_name)
        if not nums:
            return None
        if nums > 1:  # vmemory/vcore only apply to a single shared MLU
            return whole_request(nums, COMMON_WORD)
        units = int_resource(container, c.resource_memory_name) or 0
        if units > (2**31 - 1) // MEMORY_UNIT_MIB:
            raise AdmissionError(f"{c.resource_memory_name} of container "
                                 f"{container.get('name', '?')} is too large: {units}")
        cores = int_resource(container, c.resource_core_name) or 0
        return memory_request(1, COMMON_WORD, units * MEMORY_UNIT_MIB, cores)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        count = capacity(node, self.config.resource_core_name) // CORES_PER_DEVICE
        if count == 0:
            return ()
        units = capacity(node, self.config.resource_memory_name) // count
        return capacity_devices(node, count, COMMON_WORD, COMMON_WORD,
                                units * MEMORY_UNIT_MIB, CORES_PER_DEVICE,
                                split=CORES_PER_DEVICE, uuid_word="cambricon-mlu")

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if not out:
            return out
        profiles = [f"{d.index}_{d.used_cores_percent}_{d.used_memory_mib // MEMORY_UNIT_MIB}"
                    for container in grant for d in container]
        out[PROFILE] = ",".join(profiles)
        out[ASSIGNED] = "false"
        return out
