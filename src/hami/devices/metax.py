"""MetaX: ``Metax-SGPU`` (shares) here; whole ``Metax-GPU`` cards are the row
:data:`hami.devices.shares.METAX_GPU`.

Source (HAMi v2.10): (Metax sGPU reads ``metax-tech.com/node-gpu-devices``; Metax GPU reads
``metax-tech.com/gpu.topology.losses`` / ``.scores``), (``hami.io/metax-gpu-devices-…``,
``hami.io/metax-sgpu-devices-…``), (``metax:`` ``resourceCountName``,
``resourceVCountName``, ``resourceVMemoryName``, ``resourceVCoreName``,
``sgpuTopologyAware``), step 5 (policy-neutral ScoreNode x 10000):
``metax-tech.com/sgpu``, ``vcore`` (percent), ``vmemory`` in GiB; QoS policies
``best-effort|fixed-share|burst-share``.

Our choices (docs/dev/vendors-design.md): the sGPU node annotation is read in HAMi's JSON register
form (HAMi v2.10) -- its real format is not known to us; whole GPUs come from node capacity
(``<node>-metax-gpu-<i>``); the QoS policy is pod annotation ``metax-tech.com/sgpu-qos-policy``
validated at admission. Not done: the topology losses/scores and the sGPU ScoreNode (both
return 0), the app class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.codec import decode_node_devices_json
from hami.core.model import ContainerDeviceRequest, DeviceInfo
from hami.core.vendor import ResourceNames
from hami.devices.common import (
    AdmissionError,
    BaseVendor,
    Filters,
    annotation,
    in_limits,
    int_resource,
    memory_request,
    node_annotations,
)

SGPU = "Metax-SGPU"
GIB = 1024
SGPU_NODE_DEVICES = "metax-tech.com/node-gpu-devices"
TOPOLOGY_SCORES = "metax-tech.com/gpu.topology.scores"
TOPOLOGY_LOSSES = "metax-tech.com/gpu.topology.losses"
QOS_POLICY = "metax-tech.com/sgpu-qos-policy"
QOS_POLICIES = ("best-effort", "fixed-share", "burst-share")
SGPU_FILTERS = Filters(use_uuid="metax-tech.com/use-gpuuuid", nouse_uuid="metax-tech.com/nouse-gpuuuid")


@dataclass(frozen=True, slots=True)
class MetaxConfig:
    """The ``metax:`` section (HAMi v2.10)."""

    resource_count_name: str = "metax-tech.com/gpu"
    resource_vcount_name: str = "metax-tech.com/sgpu"
    resource_vmemory_name: str = "metax-tech.com/vmemory"
    resource_vcore_name: str = "metax-tech.com/vcore"
    sgpu_topology_aware: bool = False


class MetaxSgpu(BaseVendor):
    """MetaX sGPU shares (policy-neutral ScoreNode)."""

    common_word = SGPU
    handshake_key = "hami.io/node-handshake-metax-sgpu"
    to_allocate_key = "hami.io/metax-sgpu-devices-to-allocate"
    allocated_key = "hami.io/metax-sgpu-devices-allocated"
    policy_neutral = True
    filters = SGPU_FILTERS

    def __init__(self, config: MetaxConfig | None = None) -> None:
        self.config = config or MetaxConfig()

    def resource_names(self) -> ResourceNames:
        c = self.config
        return ResourceNames(c.resource_vcount_name, c.resource_vmemory_name,
                             c.resource_vcore_name, memory_unit_mib=GIB)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        request = self.container_request(container)
        if request is None:
            return False
        policy = annotation(pod, QOS_POLICY)
        if policy is not None and policy not in QOS_POLICIES:
            raise AdmissionError(f"invalid {QOS_POLICY} {policy!r}: must be one of "
                                 f"{', '.join(QOS_POLICIES)}")
        cores = int_resource(container, self.config.resource_vcore_name)
        if cores is not None and cores > 100:
            raise AdmissionError(f"invalid {self.config.resource_vcore_name} value {cores} in "
                                 f"container {container.get('name', '?')}: must be 0..100")
        return in_limits(container, self.config.resource_vcount_name)

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        c = self.config
        nums = int_resource(container, c.resource_vcount_name)
        if not nums:
            return None
        gib = int_resource(container, c.resource_vmemory_name) or 0
        if gib > (2**31 - 1) // GIB:
            raise AdmissionError(f"{c.resource_vmemory_name} of container "
                                 f"{container.get('name', '?')} is too large: {gib}")
        cores = int_resource(container, c.resource_vcore_name) or 0
        return memory_request(nums, SGPU, gib * GIB, cores)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        raw = node_annotations(node).get(SGPU_NODE_DEVICES)
        return () if raw is None else decode_node_devices_json(raw, SGPU)
