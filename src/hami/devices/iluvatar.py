"""Iluvatar (one backend per chip, ``--enable-iluvatar``).

Source (HAMi v2.10): (register ``hami.io/node-<CommonWord>-register`` in the legacy CSV form,
handshake ``hami.io/node-handshake-<CommonWord>``), (``hami.io/<CommonWord>-devices-
to-allocate|allocated``), (``iluvatars[]``: chipName, commonWord, resource names), (vMem unit 256
MiB, NVIDIA-like Fit). Default chip entries are HAMi's chart values.
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
    in_limits,
    int_resource,
    memory_request,
    node_annotations,
)

#: One unit of ``<chip>.vMem`` is 256 MiB (HAMi v2.10).
MEMORY_UNIT_MIB = 256


@dataclass(frozen=True, slots=True)
class IluvatarConfig:
    """One ``iluvatars[]`` entry (HAMi v2.10)."""

    chip_name: str
    common_word: str
    resource_count_name: str
    resource_memory_name: str
    resource_core_name: str

    @classmethod
    def for_chip(cls, chip: str) -> IluvatarConfig:
        """The chart's naming for a chip: ``iluvatar.ai/<chip>-vgpu``, ``.vMem``, ``.vCore``."""
        return cls(chip, chip, f"iluvatar.ai/{chip}-vgpu", f"iluvatar.ai/{chip}.vMem",
                   f"iluvatar.ai/{chip}.vCore")


DEFAULT_CHIPS = ("MR-V100", "MR-V50", "BI-V100", "BI-V150")


class Iluvatar(BaseVendor):
    """One Iluvatar chip family."""

    def __init__(self, config: IluvatarConfig) -> None:
        self.config = config
        word = config.common_word
        self.common_word = word
        self.register_key = f"hami.io/node-{word}-register"
        self.handshake_key = f"hami.io/node-handshake-{word}"
        self.to_allocate_key = f"hami.io/{word}-devices-to-allocate"
        self.allocated_key = f"hami.io/{word}-devices-allocated"

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_count_name, c.resource_memory_name,
                             c.resource_core_name, memory_unit_mib=MEMORY_UNIT_MIB)

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
        units = int_resource(container, c.resource_memory_name) or 0
        if units > (2**31 - 1) // MEMORY_UNIT_MIB:
            raise AdmissionError(f"{c.resource_memory_name} of container "
                                 f"{container.get('name', '?')} is too large: {units}")
        cores = int_resource(container, c.resource_core_name) or 0
        return memory_request(nums, self.common_word, units * MEMORY_UNIT_MIB, cores)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        raw = node_annotations(node).get(self.register_key or "")
        return () if raw is None else decode_node_devices_legacy(raw, self.common_word)
