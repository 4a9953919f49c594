"""Cambricon MLU (CommonWord ``MLU``), dynamic SMLU sharing: what is its own.

The declarations (keys, names, units, capacity devices, own lock) are the row
:data:`hami.devices.shares.CAMBRICON`; this module adds the DSMLU profile annotations.

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

from hami.core.model import PodSingleDevice
from hami.core.vendor import PatchContext
from hami.devices.shares import CAMBRICON, ShareNames, ShareVendor

PROFILE = "CAMBRICON_DSMLU_PROFILE"
ASSIGNED = "CAMBRICON_DSMLU_ASSIGNED"


class Cambricon(ShareVendor):
    """Cambricon dynamic SMLU: the generic share backend plus the DSMLU profiles."""

    def __init__(self, names: ShareNames | None = None) -> None:
        super().__init__(CAMBRICON, names)

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if not out:
            return out
        unit = CAMBRICON.memory_unit_mib
        profiles = [f"{d.index}_{d.used_cores_percent}_{d.used_memory_mib // unit}"
                    for container in grant for d in container]
        out[PROFILE] = ",".join(profiles)
        out[ASSIGNED] = "false"
        return out
