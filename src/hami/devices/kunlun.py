"""Kunlunxin: ``kunlun`` (whole XPUs) and ``XPU`` (vXPU shares).

Source (HAMi v2.10): (``hami.io/node-register-xpu`` JSON, ``hami.io/node-handshake-xpu``),
(``hami.io/xpu-devices-…``; whole XPUs only ``hami.io/kunlun-allocated``), (``kunlun:``
``resourceCountName``, ``resourceVCountName``, ``resourceVMemoryName``), (whole XPU
``kunlunxin.com/xpu`` from capacity with topology groups and
``BAIDU_COM_DEVICE_IDX``; vXPU ``kunlunxin.com/vxpu`` + ``-memory`` with memory templates,
max 98304). HAMi's Kunlunxin guides add: whole requests are 1, 2, 4 or 8 cards and 1, 2
or 4 must stay within one NUMA half (cards 0-3 / 4-7), fragmentation minimised; vXPU
memory rounds to 24576 (1/4 card) or 49152 (1/2 card), above that a whole card; UUID
filters ``hami.io/use-xpu-uuid`` / ``hami.io/no-use-xpu-uuid``.

The declarations are the rows :data:`WHOLE` (whole XPUs, served by
:class:`~hami.devices.shares.WholeCardVendor`) and :data:`hami.devices.shares.KUNLUN_VXPU`;
this module adds the card sizes, the topology-aware Fit and ScoreNode, and the vXPU
memory templates.

Fragmentation is measured by MTF ("minimized tasks to fill", HAMi's Kunlunxin topology
guide): the Fit takes the valid card set leaving the smallest MTF, and ScoreNode is
``MTF(before) - MTF(after)`` (higher is better: a smaller increase of MTF). HAMi's exact
score scale is not known to us; ours is documented in docs/dev/vendors-design.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from hami.core import fit as f
from hami.core.fit import DeviceState, FitOutcome
from hami.core.model import (
    ContainerDevice,
    ContainerDeviceRequest,
    ContainerDevices,
    PodSingleDevice,
)
from hami.core.vendor import FitContext, PatchContext
from hami.devices.cardfit import finish_pick, indices, screened, too_few
from hami.devices.common import AdmissionError, int_resource
from hami.devices.shares import KUNLUN_VXPU, ShareNames, ShareVendor, WholeCardVendor, WholeRow

KUNLUN = "kunlun"
XPU = KUNLUN_VXPU.common_word
WHOLE_SIZES = (1, 2, 4, 8)
GROUP_SIZE = 4
DEVICE_IDX = "BAIDU_COM_DEVICE_IDX"
#: vXPU memory templates in MiB (1/4, 1/2, whole P800 card) and the share of cores each is.
XPU_TEMPLATES = ((24576, 25), (49152, 50), (98304, 100))
#: Whole XPUs: devices from capacity, ``<node>-kunlun-<i>``, only an allocated annotation.
WHOLE = WholeRow(KUNLUN, "hami.io/node-handshake-kunlun", "hami.io/kunlun-allocated", None,
                 "kunlunxin.com/xpu", KUNLUN)


@dataclass(frozen=True, slots=True)
class KunlunConfig:
    """The ``kunlun:`` section (HAMi v2.10)."""

    resource_count_name: str = WHOLE.count_name
    resource_vcount_name: str = KUNLUN_VXPU.defaults.resource_count_name
    resource_vmemory_name: str = KUNLUN_VXPU.defaults.resource_memory_name

def mtf(free: Iterable[int]) -> int:
    """Minimized Tasks to Fill: how many aligned tasks (8, 4, 2, 1 cards) fill the free
    cards (HAMi's Kunlunxin topology guide). All 8 free is one task; otherwise per half
    a fully free half is one task, else one task per aligned pair with a free card.
    ``11111111`` (all used) is 0, ``00000011`` 2, ``00000001`` 3, ``00010001`` 4."""
    free_set = set(free)
    if free_set >= set(range(8)):
        return 1
    tasks = 0
    for start in range(0, 8, GROUP_SIZE):
        half = set(range(start, start + GROUP_SIZE))
        if half <= free_set:
            tasks += 1
            continue
        tasks += sum(1 for a in range(start, start + GROUP_SIZE, 2) if {a, a + 1} & free_set)
    return tasks


def topology_pick(free: Sequence[int], nums: int) -> tuple[int, ...] | None:
    """Card indices for a whole request of ``nums`` among ``free`` card indices.

    8 needs all of 0-7; 1, 2 and 4 stay inside one half (0-3 or 4-7). Among the valid
    sets the one leaving the smallest MTF wins (least fragmentation), then the one with
    more aligned pairs (0-1, 2-3, ...: the directly linked cards), then the lowest indices.
    """
    if nums not in WHOLE_SIZES:
        return None
    free_set = set(free)
    if nums == 8:
        return tuple(range(8)) if free_set >= set(range(8)) else None
    best: tuple[int, int, tuple[int, ...]] | None = None
    for start in range(0, 8, GROUP_SIZE):
        members = sorted(i for i in free_set if start <= i < start + GROUP_SIZE)
        for combo in combinations(members, nums):
            pairs = sum(1 for a in combo if a % 2 == 0 and a + 1 in combo)
            key = (mtf(free_set - set(combo)), -pairs, combo)
            if best is None or key < best:
                best = key
    return None if best is None else best[2]


class Kunlun(WholeCardVendor):
    """Whole Kunlunxin XPUs (CommonWord ``kunlun``): 1, 2, 4 or 8 cards, topology-aware."""

    def __init__(self, config: KunlunConfig | None = None) -> None:
        super().__init__(WHOLE, (config or KunlunConfig()).resource_count_name)

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        nums = int_resource(container, self.count_name)
        if nums and nums not in WHOLE_SIZES:
            raise AdmissionError(f"{self.count_name} of container "
                                 f"{container.get('name', '?')} must be 1, 2, 4 or 8, got {nums}")
        return super().container_request(container)

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        if (short := too_few(devices, request.nums)) is not None:
            return short
        counts: Counter[str] = Counter()
        free: dict[int, DeviceState] = {}
        for dev in screened(devices, ctx, self.filters, counts):
            if dev.used_slots >= dev.info.split_count:
                counts[f.CARD_TIME_SLICING_EXHAUSTED] += 1
            else:
                free[dev.info.index] = dev
        picked = topology_pick(sorted(free), request.nums)
        grant = None if picked is None else tuple(
            ContainerDevice(free[i].info.uuid, KUNLUN, 0, 100, i) for i in picked)
        return finish_pick(counts, len(free), request.nums, len(devices), grant, ctx)

    def score_node(self, devices: Sequence[DeviceState], grant: Sequence[ContainerDevices],
                   ctx: FitContext) -> float:
        """``MTF(before) - MTF(after)`` over the node's cards (0 when nothing granted)."""
        free = {d.info.index for d in devices
                if d.info.health and d.used_slots < d.info.split_count}
        taken = {d.index for container in grant for d in container}
        if not taken:
            return 0.0
        return float(mtf(free) - mtf(free - taken))

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if out:
            out[DEVICE_IDX] = indices(grant)
        return out


def xpu_template(memory_mib: int) -> tuple[int, int]:
    """``(memory MiB, cores percent)`` of the smallest vXPU template holding the request;
    0 (no memory given) or more than the largest template is a whole card."""
    if memory_mib > 0:
        for size, cores in XPU_TEMPLATES:
            if memory_mib <= size:
                return size, cores
    return XPU_TEMPLATES[-1]


class KunlunVxpu(ShareVendor):
    """Kunlunxin vXPU shares (CommonWord ``XPU``), NVIDIA-like Fit on template sizes."""

    def __init__(self, config: KunlunConfig | None = None) -> None:
        c = config or KunlunConfig()
        super().__init__(KUNLUN_VXPU, ShareNames(c.resource_vcount_name,
                                                 c.resource_vmemory_name, ""))

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        nums = int_resource(container, self.config.resource_count_name)
        if not nums:
            return None
        memory = int_resource(container, self.config.resource_memory_name) or 0
        size, cores = xpu_template(memory)
        if cores == 100:
            return ContainerDeviceRequest(nums, XPU, 0, 100, 100)
        return ContainerDeviceRequest(nums, XPU, size, 101, cores)
