"""AMD (CommonWord ``AMD``).

Source (HAMi v2.10): (``hami.io/node-amd-register``, JSON form of HAMi v2.10),
(``hami.io/amd-devices-…``), (``amd:`` resource names), (AMD core metrics
normalised): ``amd.com/gpu``, optional ``amd.com/gpumem`` (MiB) and ``amd.com/gpucores``
(a 1-100 percentage; the webhook rejects others; omitted => 100) converted per card to
compute units ``min(Totalcore, max(1, Totalcore x pct / 100))``; omitted or zero memory =>
the whole card; filters ``amd.com/use|nouse-gputype``, ``amd.com/use-gpu-uuid|nouse-gpu-uuid``;
the allocation's ``Type`` is the card model. ``devcore`` of a card is its CU count.

The Fit is the HAMi v2.10 order with the CU conversion in place of the 100-percent core rules
(which do not apply to CU counts); the exclusive-card rule uses "all CUs" instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.core import fit as f
from hami.core.fit import DeviceState, FitOutcome, gen_reason
from hami.core.model import ContainerDevice, ContainerDeviceRequest
from hami.core.vendor import FitContext, ResourceNames
from hami.devices.common import (
    AdmissionError,
    BaseVendor,
    Filters,
    in_limits,
    int_resource,
    memory_request,
)

COMMON_WORD = "AMD"
REGISTER = "hami.io/node-amd-register"
HANDSHAKE = "hami.io/node-handshake-amd"
TO_ALLOCATE = "hami.io/amd-devices-to-allocate"
ALLOCATED = "hami.io/amd-devices-allocated"
FILTERS = Filters(use_type="amd.com/use-gputype", nouse_type="amd.com/nouse-gputype",
                  use_uuid="amd.com/use-gpu-uuid", nouse_uuid="amd.com/nouse-gpu-uuid")


def compute_units(total_cus: int, percent: int) -> int:
    """CUs for a core percentage on a card of ``total_cus`` (HAMi v2.10)."""
    return min(total_cus, max(1, total_cus * percent // 100))


@dataclass(frozen=True, slots=True)
class AmdConfig:
    """The ``amd:`` section (HAMi v2.10)."""

    resource_count_name: str = "amd.com/gpu"
    resource_memory_name: str = "amd.com/gpumem"
    resource_core_name: str = "amd.com/gpucores"


class Amd(BaseVendor):
    """AMD Instinct soft vGPU."""

    common_word = COMMON_WORD
    handshake_key = HANDSHAKE
    register_key = REGISTER
    to_allocate_key = TO_ALLOCATE
    allocated_key = ALLOCATED
    filters = FILTERS

    def __init__(self, config: AmdConfig | None = None) -> None:
        self.config = config or AmdConfig()

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_count_name, c.resource_memory_name, c.resource_core_name)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        self.container_request(container)
        return in_limits(container, self.config.resource_count_name)

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        c = self.config
        nums = int_resource(container, c.resource_count_name)
        if not nums:
            return None
        pct = int_resource(container, c.resource_core_name)
        if pct is None:
            pct = 100
        if not 1 <= pct <= 100:
            raise AdmissionError(f"invalid {c.resource_core_name} value {pct} in container "
                                 f"{container.get('name', '?')}: must be a percentage 1..100")
        memory = int_resource(container, c.resource_memory_name) or 0
        return memory_request(nums, COMMON_WORD, memory, pct)

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        if request.nums > len(devices):
            return FitOutcome(False, reason=f.NODE_INSUFFICIENT_DEVICE)
        anns = ctx.pod_annotations
        use, nouse = self.filters.uuids(anns)
        cordoned = ctx.cordoned
        counts: Counter[str] = Counter()
        chosen: list[ContainerDevice] = []
        for dev in devices:
            info = dev.info
            if not info.health:
                counts[f.CARD_NOT_HEALTH] += 1
            elif info.uuid in cordoned:
                counts[f.CARD_CORDONED] += 1
            elif not self.filters.type_ok(anns, info.type):
                counts[f.CARD_TYPE_MISMATCH] += 1
            elif (use and info.uuid not in use) or info.uuid in nouse:
                counts[f.CARD_UUID_MISMATCH] += 1
            elif info.split_count <= dev.used_slots:
                counts[f.CARD_TIME_SLICING_EXHAUSTED] += 1
            else:
                memory = request.memory_on(info.memory_mib)
                cus = compute_units(info.cores_percent, request.cores_percent)
                candidate = ContainerDevice(info.uuid, info.type, memory, cus, info.index)
                if ctx.quota_ok is not None and not ctx.quota_ok([*chosen, candidate]):
                    counts[f.RESOURCE_QUOTA_NOT_FIT] += 1
                elif info.memory_mib - dev.used_memory_mib < memory:
                    counts[f.CARD_INSUFFICIENT_MEMORY] += 1
                elif info.cores_percent - dev.used_cores < cus:
                    counts[f.CARD_INSUFFICIENT_CORE] += 1
                elif cus == info.cores_percent and dev.used_slots > 0:
                    counts[f.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
                else:
                    chosen.append(candidate)
                    if len(chosen) == request.nums:
                        return FitOutcome(True, tuple(chosen))
        if chosen:
            counts[f.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += len(chosen)
        return FitOutcome(False, reason=gen_reason(counts, len(devices)))
