"""Enflame: ``Enflame`` (shared vGCU) here; whole ``GCU`` cards are the row
:data:`hami.devices.shares.ENFLAME_GCU`.

Source (HAMi v2.10): (Enflame DRS reads ``enflame.com/gcu-drs-capacity``),
(``hami.io/enflame-gcu-devices-…``; ``Enflame`` only ``hami.io/enflame-vgpu-devices-allocated``),
(``enflame:`` ``resourceNameGCU``, ``resourceNameDRSGCU``, ``resourceNameGCUMemory``,
``resourceNameGCUCore``, ``resourceNameVGCU``, ``resourceNameVGCUPercentage``), (whole
GCUs from capacity; writes ``enflame.com/gcu-assigned*``). HAMi's Enflame guide: a share is
``enflame.com/vgcu: 1`` plus ``enflame.com/vgcu-percentage`` (1 % of memory and cores,
default 100); only one vGCU per container; UUIDs ``<node>-enflame-<i>``; filters
``enflame.com/use-gpuuuid`` / ``nouse-gpuuuid``.

Our choices (docs/dev/vendors-design.md): shared cards are synthesised from the capacity of the
percentage resource (100 units per card); ``enflame.com/gcu-assigned`` is written ``false``.
Not done: DRS profiles from ``enflame.com/gcu-drs-capacity`` (format not known to us).
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
)

ENFLAME = "Enflame"
DRS_CAPACITY = "enflame.com/gcu-drs-capacity"
ASSIGNED = "enflame.com/gcu-assigned"
FILTERS = Filters(use_uuid="enflame.com/use-gpuuuid", nouse_uuid="enflame.com/nouse-gpuuuid")


@dataclass(frozen=True, slots=True)
class EnflameConfig:
    """The ``enflame:`` section (HAMi v2.10), the names this backend reads."""

    resource_name_gcu: str = "enflame.com/gcu"
    resource_name_vgcu: str = "enflame.com/vgcu"
    resource_name_vgcu_percentage: str = "enflame.com/vgcu-percentage"


class EnflameShare(BaseVendor):
    """Shared vGCU: a percentage of one card's memory and cores."""

    common_word = ENFLAME
    handshake_key = "hami.io/node-handshake-enflame"
    allocated_key = "hami.io/enflame-vgpu-devices-allocated"
    filters = FILTERS

    def __init__(self, config: EnflameConfig | None = None) -> None:
        self.config = config or EnflameConfig()

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_name_vgcu, c.resource_name_vgcu_percentage,
                             c.resource_name_vgcu_percentage)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        self.container_request(container)
        return in_limits(container, self.config.resource_name_vgcu)

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        c = self.config
        nums = int_resource(container, c.resource_name_vgcu)
        if not nums:
            return None
        if nums != 1:
            raise AdmissionError(f"{c.resource_name_vgcu} of container "
                                 f"{container.get('name', '?')} must be 1, got {nums}")
        pct = int_resource(container, c.resource_name_vgcu_percentage)
        pct = 100 if pct is None else pct
        if not 1 <= pct <= 100:
            raise AdmissionError(f"{c.resource_name_vgcu_percentage} of container "
                                 f"{container.get('name', '?')} must be 1..100, got {pct}")
        return ContainerDeviceRequest(1, ENFLAME, 0, pct, pct)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        cards = capacity(node, self.config.resource_name_vgcu_percentage) // 100
        return capacity_devices(node, cards, ENFLAME, ENFLAME, 0, 100, split=100,
                                uuid_word="enflame")

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if out:
            out[ASSIGNED] = "false"
        return out
