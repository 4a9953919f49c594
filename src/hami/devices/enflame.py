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

The shared vGCU's declarations are the row :data:`SHARE` (served by
:class:`~hami.devices.shares.ShareVendor`); this module adds its request, devices and
annotation.

Our choices (docs/dev/vendors-design.md): shared cards are synthesised from the capacity of the
percentage resource (100 units per card); ``enflame.com/gcu-assigned`` is written ``false``.
Not done: DRS profiles from ``enflame.com/gcu-drs-capacity`` (format not known to us).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.model import ContainerDeviceRequest, DeviceInfo, PodSingleDevice
from hami.core.vendor import PatchContext
from hami.devices.common import AdmissionError, capacity, capacity_devices, int_resource
from hami.devices.shares import ENFLAME_GCU, ShareNames, ShareRow, ShareVendor

ENFLAME = "Enflame"
DRS_CAPACITY = "enflame.com/gcu-drs-capacity"
ASSIGNED = "enflame.com/gcu-assigned"
#: The shared vGCU: count ``vgcu``, memory and cores both ``vgcu-percentage``.
SHARE = ShareRow(
    ENFLAME, "hami.io/node-handshake-enflame", "hami.io/enflame-vgpu-devices-allocated",
    ShareNames("enflame.com/vgcu", "enflame.com/vgcu-percentage", "enflame.com/vgcu-percentage"),
    register="capacity", checked_cores=True, uuid_word="enflame",
    filters=ENFLAME_GCU.filters)


@dataclass(frozen=True, slots=True)
class EnflameConfig:
    """The ``enflame:`` section (HAMi v2.10), the names this backend reads."""

    resource_name_gcu: str = ENFLAME_GCU.count_name
    resource_name_vgcu: str = SHARE.defaults.resource_count_name
    resource_name_vgcu_percentage: str = SHARE.defaults.resource_memory_name


class EnflameShare(ShareVendor):
    """Shared vGCU: a percentage of one card's memory and cores."""

    def __init__(self, config: EnflameConfig | None = None) -> None:
        c = config or EnflameConfig()
        pct = c.resource_name_vgcu_percentage
        super().__init__(SHARE, ShareNames(c.resource_name_vgcu, pct, pct))

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        c = self.config
        nums = int_resource(container, c.resource_count_name)
        if not nums:
            return None
        if nums != 1:
            raise AdmissionError(f"{c.resource_count_name} of container "
                                 f"{container.get('name', '?')} must be 1, got {nums}")
        pct = int_resource(container, c.resource_core_name)
        pct = 100 if pct is None else pct
        if not 1 <= pct <= 100:
            raise AdmissionError(f"{c.resource_core_name} of container "
                                 f"{container.get('name', '?')} must be 1..100, got {pct}")
        return ContainerDeviceRequest(1, ENFLAME, 0, pct, pct)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        cards = capacity(node, self.config.resource_core_name) // 100
        return capacity_devices(node, cards, ENFLAME, ENFLAME, 0, 100, split=100,
                                uuid_word="enflame")

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if out:
            out[ASSIGNED] = "false"
        return out
