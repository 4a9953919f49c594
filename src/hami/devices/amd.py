"""AMD (CommonWord ``AMD``).

Source (HAMi v2.10): (``hami.io/node-amd-register``, JSON form of HAMi v2.10),
(``hami.io/amd-devices-…``), (``amd:`` resource names), (AMD core metrics
normalised): ``amd.com/gpu``, optional ``amd.com/gpumem`` (MiB) and ``amd.com/gpucores``
(a 1-100 percentage; the webhook rejects others; omitted => 100) converted per card to
compute units ``min(Totalcore, max(1, Totalcore x pct / 100))``; omitted or zero memory =>
the whole card; filters ``amd.com/use|nouse-gputype``, ``amd.com/use-gpu-uuid|nouse-gpu-uuid``;
the allocation's ``Type`` is the card model. ``devcore`` of a card is its CU count.

The declarations and requests are the row :data:`hami.devices.shares.AMD`; this module
adds the Fit, the HAMi v2.10 order with the CU conversion in place of the 100-percent core rules
(which do not apply to CU counts); the exclusive-card rule uses "all CUs" instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hami.core import fit as f
from hami.core.fit import DeviceState, FitOutcome, gen_reason
from hami.core.model import ContainerDevice, ContainerDeviceRequest
from hami.core.vendor import FitContext
from hami.devices.cardfit import screened, too_few
from hami.devices.shares import AMD, ShareNames, ShareVendor

COMMON_WORD = AMD.common_word


def compute_units(total_cus: int, percent: int) -> int:
    """CUs for a core percentage on a card of ``total_cus`` (HAMi v2.10)."""
    return min(total_cus, max(1, total_cus * percent // 100))


class Amd(ShareVendor):
    """AMD Instinct soft vGPU: the generic share backend with a Fit in compute units."""

    def __init__(self, names: ShareNames | None = None) -> None:
        super().__init__(AMD, names)

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        if (short := too_few(devices, request.nums)) is not None:
            return short
        counts: Counter[str] = Counter()
        chosen: list[ContainerDevice] = []
        for dev in screened(devices, ctx, self.filters, counts):
            info = dev.info
            if info.split_count <= dev.used_slots:
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
