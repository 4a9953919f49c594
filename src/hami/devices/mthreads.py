"""Moore Threads (CommonWord ``Mthreads``).

Source (HAMi v2.10): (only ``hami.io/mthreads-vgpu-devices-allocated`` is written), (``mthreads:``
resource names): ``mthreads.com/vgpu``, ``mthreads.com/sgpu-memory``
(512 MiB units, legal values 2, 4, 8, 16, 32, 64, 96), ``mthreads.com/sgpu-core``; a count
above 1 forces whole cards; the webhook writes ``mthreads.com/request-gpu-num``; the
scheduler writes ``mthreads.com/gpu-index`` (device indices), ``mthreads.com/predicate-time``
(UnixNano) and ``mthreads.com/predicate-node``.

Our choices where HAMi is silent (docs/dev/vendors-design.md): devices come from node capacity,
``sgpu-core`` capacity / 16 cards (16 core units per card, the MTT S4000 example of the
vendor guide), memory = ``sgpu-memory`` capacity x 512 MiB / cards, UUID
``<node>-mthreads-<i>``; ``sgpu-core`` is in those core units; a memory value outside the
legal list is refused at admission.
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
    capacity,
    capacity_devices,
    in_limits,
    int_resource,
    memory_request,
)

COMMON_WORD = "Mthreads"
MEMORY_UNIT_MIB = 512
LEGAL_MEMORY_UNITS = (2, 4, 8, 16, 32, 64, 96)
CORES_PER_CARD = 16
ALLOCATED = "hami.io/mthreads-vgpu-devices-allocated"
HANDSHAKE = "hami.io/node-handshake-mthreads"
REQUEST_GPU_NUM = "mthreads.com/request-gpu-num"
GPU_INDEX = "mthreads.com/gpu-index"
PREDICATE_TIME = "mthreads.com/predicate-time"
PREDICATE_NODE = "mthreads.com/predicate-node"


@dataclass(frozen=True, slots=True)
class MthreadsConfig:
    """The ``mthreads:`` section (HAMi v2.10)."""

    resource_count_name: str = "mthreads.com/vgpu"
    resource_memory_name: str = "mthreads.com/sgpu-memory"
    resource_core_name: str = "mthreads.com/sgpu-core"


class Mthreads(BaseVendor):
    """Moore Threads sGPU."""

    common_word = COMMON_WORD
    handshake_key = HANDSHAKE
    allocated_key = ALLOCATED

    def __init__(self, config: MthreadsConfig | None = None) -> None:
        self.config = config or MthreadsConfig()

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_count_name, c.resource_memory_name,
                             c.resource_core_name, memory_unit_mib=MEMORY_UNIT_MIB)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        request = self.container_request(container)
        if request is None or not in_limits(container, self.config.resource_count_name):
            return False
        anns = pod.setdefault("metadata", {}).setdefault("annotations", {})
        anns[REQUEST_GPU_NUM] = str(request.nums)
        return True

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        c = self.config
        nums = int_resource(container, c.resource_count_name)
        if not nums:
            return None
        if nums > 1:
            return ContainerDeviceRequest(nums, COMMON_WORD, 0, 100, CORES_PER_CARD)
        units = int_resource(container, c.resource_memory_name)
        if units is not None and units not in LEGAL_MEMORY_UNITS:
            raise AdmissionError(f"invalid {c.resource_memory_name} value {units} in container "
                                 f"{container.get('name', '?')}: must be one of "
                                 f"{', '.join(map(str, LEGAL_MEMORY_UNITS))} (x512 MiB)")
        cores = int_resource(container, c.resource_core_name)
        if cores is not None and cores > CORES_PER_CARD:
            raise AdmissionError(f"invalid {c.resource_core_name} value {cores} in container "
                                 f"{container.get('name', '?')}: must be 0..{CORES_PER_CARD}")
        if units is None and cores is None:  # exclusive card
            return ContainerDeviceRequest(1, COMMON_WORD, 0, 100, CORES_PER_CARD)
        return memory_request(1, COMMON_WORD, (units or 0) * MEMORY_UNIT_MIB, cores or 0)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        cards = capacity(node, self.config.resource_core_name) // CORES_PER_CARD
        if cards == 0:
            return ()
        memory = capacity(node, self.config.resource_memory_name) * MEMORY_UNIT_MIB // cards
        return capacity_devices(node, cards, COMMON_WORD, COMMON_WORD, memory,
                                CORES_PER_CARD, split=CORES_PER_CARD, uuid_word="mthreads")

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if not out:
            return out
        out[GPU_INDEX] = ",".join(str(d.index) for container in grant for d in container)
        out[PREDICATE_TIME] = str(ctx.now_ns)
        out[PREDICATE_NODE] = ctx.node_name
        return out
