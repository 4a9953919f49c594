"""MetaX: ``Metax-SGPU`` (shares) here; whole ``Metax-GPU`` cards are the row
:data:`hami.devices.shares.METAX_GPU`.

Source (HAMi v2.10): (Metax sGPU reads ``metax-tech.com/node-gpu-devices``; Metax GPU reads
``metax-tech.com/gpu.topology.losses`` / ``.scores``), (``hami.io/metax-gpu-devices-…``,
``hami.io/metax-sgpu-devices-…``), (``metax:`` ``resourceCountName``,
``resourceVCountName``, ``resourceVMemoryName``, ``resourceVCoreName``,
``sgpuTopologyAware``), step 5 (policy-neutral ScoreNode x 10000):
``metax-tech.com/sgpu``, ``vcore`` (percent), ``vmemory`` in GiB; QoS policies
``best-effort|fixed-share|burst-share``.

The sGPU declarations, requests and devices are the row
:data:`hami.devices.shares.METAX_SGPU`; this module adds the QoS policy and the section.

Our choices (docs/dev/vendors-design.md): the sGPU node annotation is read in HAMi's JSON register
form (HAMi v2.10) -- its real format is not known to us; whole GPUs come from node capacity
(``<node>-metax-gpu-<i>``); the QoS policy is pod annotation ``metax-tech.com/sgpu-qos-policy``
validated at admission. Not done: the topology losses/scores and the sGPU ScoreNode (both
return 0), the app class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami.devices.common import AdmissionError, annotation
from hami.devices.shares import METAX_SGPU, ShareNames, ShareVendor

SGPU = METAX_SGPU.common_word
GIB = METAX_SGPU.memory_unit_mib
QOS_POLICY = "metax-tech.com/sgpu-qos-policy"
QOS_POLICIES = ("best-effort", "fixed-share", "burst-share")


@dataclass(frozen=True, slots=True)
class MetaxConfig:
    """The ``metax:`` section (HAMi v2.10); ``sgpuTopologyAware`` is read but not used."""

    resource_count_name: str = "metax-tech.com/gpu"
    resource_vcount_name: str = "metax-tech.com/sgpu"
    resource_vmemory_name: str = "metax-tech.com/vmemory"
    resource_vcore_name: str = "metax-tech.com/vcore"
    sgpu_topology_aware: bool = False


class MetaxSgpu(ShareVendor):
    """MetaX sGPU shares (policy-neutral ScoreNode) with the QoS policy annotation."""

    def __init__(self, config: MetaxConfig | None = None) -> None:
        c = config or MetaxConfig()
        super().__init__(METAX_SGPU, ShareNames(c.resource_vcount_name,
                                                c.resource_vmemory_name, c.resource_vcore_name))

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        if self.container_request(container) is None:
            return False
        policy = annotation(pod, QOS_POLICY)
        if policy is not None and policy not in QOS_POLICIES:
            raise AdmissionError(f"invalid {QOS_POLICY} {policy!r}: must be one of "
                                 f"{', '.join(QOS_POLICIES)}")
        return super().mutate_admission(container, pod)
