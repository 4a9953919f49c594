"""Moore Threads (CommonWord ``Mthreads``).

Source (HAMi v2.10): (only ``hami.io/mthreads-vgpu-devices-allocated`` is written), (``mthreads:``
resource names): ``mthreads.com/vgpu``, ``mthreads.com/sgpu-memory``
(512 MiB units, legal values 2, 4, 8, 16, 32, 64, 96), ``mthreads.com/sgpu-core``; a count
above 1 forces whole cards; the webhook writes ``mthreads.com/request-gpu-num``; the
scheduler writes ``mthreads.com/gpu-index`` (device indices), ``mthreads.com/predicate-time``
(UnixNano) and ``mthreads.com/predicate-node``.

The declarations, requests and devices are the row :data:`hami.devices.shares.MTHREADS`;
this module adds the webhook's and the scheduler's annotations.

Our choices where HAMi is silent (docs/dev/vendors-design.md): devices come from node capacity,
``sgpu-core`` capacity / 16 cards (16 core units per card, the MTT S4000 example of the
vendor guide), memory = ``sgpu-memory`` capacity x 512 MiB / cards, UUID
``<node>-mthreads-<i>``; ``sgpu-core`` is in those core units; a memory value outside the
legal list is refused at admission.
"""

from __future__ import annotations

from typing import Any

from hami.core.model import PodSingleDevice
from hami.core.vendor import PatchContext
from hami.devices.cardfit import indices
from hami.devices.common import in_limits
from hami.devices.shares import MTHREADS, ShareNames, ShareVendor

COMMON_WORD = MTHREADS.common_word
MEMORY_UNIT_MIB = MTHREADS.memory_unit_mib
LEGAL_MEMORY_UNITS = MTHREADS.legal_memory_units
CORES_PER_CARD = MTHREADS.cores_per_device
REQUEST_GPU_NUM = "mthreads.com/request-gpu-num"
GPU_INDEX = "mthreads.com/gpu-index"
PREDICATE_TIME = "mthreads.com/predicate-time"
PREDICATE_NODE = "mthreads.com/predicate-node"


class Mthreads(ShareVendor):
    """Moore Threads sGPU: the generic share backend plus its annotations."""

    def __init__(self, names: ShareNames | None = None) -> None:
        super().__init__(MTHREADS, names)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        request = self.container_request(container)
        if request is None or not in_limits(container, self.config.resource_count_name):
            return False
        anns = pod.setdefault("metadata", {}).setdefault("annotations", {})
        anns[REQUEST_GPU_NUM] = str(request.nums)
        return True

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if out:
            out.update({GPU_INDEX: indices(grant), PREDICATE_TIME: str(ctx.now_ns),
                        PREDICATE_NODE: ctx.node_name})
        return out
