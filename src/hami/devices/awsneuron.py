"""AWS Neuron (CommonWord ``AWSNeuron``).

Source (HAMi v2.10): (only ``hami.io/aws-neuron-devices-allocated``), (``awsneuron:``
``resourceCountName``/``resourceCoreName``): ``aws.amazon.com/neuron`` (whole devices)
and ``aws.amazon.com/neuroncore`` (1 or an even number), devices from node capacity,
writes ``AWS_NEURON_IDS`` and ``aws.amazon.com/predicate-node``. From HAMi's AWS Neuron
guide: one core is half a device, device UUIDs are ``<node>-AWSNeuron-<index>``, several
devices of one container are chosen connected (we take consecutive indices).

Not done: the ``NEURON_*`` core-visibility annotations (which core of a half-used device
is free is not visible in aggregated usage).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.core import fit as f
from hami.core.fit import DeviceState, FitOutcome, gen_reason
from hami.core.model import (
    ContainerDevice,
    ContainerDeviceRequest,
    DeviceInfo,
    PodSingleDevice,
)
from hami.core.vendor import FitContext, PatchContext, ResourceNames
from hami.devices.common import (
    AdmissionError,
    BaseVendor,
    Filters,
    capacity,
    capacity_devices,
    in_limits,
    int_resource,
)

COMMON_WORD = "AWSNeuron"
CORES_PER_DEVICE = 2
HALF = 100 // CORES_PER_DEVICE
ALLOCATED = "hami.io/aws-neuron-devices-allocated"
HANDSHAKE = "hami.io/node-handshake-awsneuron"
NEURON_IDS = "AWS_NEURON_IDS"
PREDICATE_NODE = "aws.amazon.com/predicate-node"
FILTERS = Filters(use_uuid="aws.amazon.com/use-gpuuuid", nouse_uuid="aws.amazon.com/nouse-gpuuuid")


@dataclass(frozen=True, slots=True)
class NeuronConfig:
    """The ``awsneuron:`` section (HAMi v2.10)."""

    resource_count_name: str = "aws.amazon.com/neuron"
    resource_core_name: str = "aws.amazon.com/neuroncore"


def devices_for_cores(cores: int) -> tuple[int, int]:
    """``(devices, cores percent per device)`` for a ``neuroncore`` request: 1 core is
    half a device; an even number is whole devices; anything else is refused."""
    if cores == 1:
        return 1, HALF
    if cores > 0 and cores % CORES_PER_DEVICE == 0:
        return cores // CORES_PER_DEVICE, 100
    raise AdmissionError(f"aws.amazon.com/neuroncore must be 1 or an even number, got {cores}")


class AwsNeuron(BaseVendor):
    """AWS Inferentia/Trainium devices and core groups."""

    common_word = COMMON_WORD
    handshake_key = HANDSHAKE
    allocated_key = ALLOCATED
    filters = FILTERS

    def __init__(self, config: NeuronConfig | None = None) -> None:
        self.config = config or NeuronConfig()

    def resource_names(self) -> ResourceNames:
        return ResourceNames(self.config.resource_count_name, "", self.config.resource_core_name)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        self.container_request(container)
        return (in_limits(container, self.config.resource_count_name)
                or in_limits(container, self.config.resource_core_name))

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        nums = int_resource(container, self.config.resource_count_name)
        if nums:
            return ContainerDeviceRequest(nums, COMMON_WORD, 0, 100, 100)
        cores = int_resource(container, self.config.resource_core_name)
        if not cores:
            return None
        count, share = devices_for_cores(cores)
        return ContainerDeviceRequest(count, COMMON_WORD, 0, 100, share)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        count = capacity(node, self.config.resource_count_name)
        return capacity_devices(node, count, COMMON_WORD, COMMON_WORD, 0, 100,
                                split=CORES_PER_DEVICE)

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        if request.nums > len(devices):
            return FitOutcome(False, reason=f.NODE_INSUFFICIENT_DEVICE)
        use, nouse = self.filters.uuids(ctx.pod_annotations)
        counts: Counter[str] = Counter()
        free: list[DeviceState] = []
        for dev in devices:
            info = dev.info
            if not info.health:
                counts[f.CARD_NOT_HEALTH] += 1
            elif info.uuid in ctx.cordoned:
                counts[f.CARD_CORDONED] += 1
            elif (use and info.uuid not in use) or info.uuid in nouse:
                counts[f.CARD_UUID_MISMATCH] += 1
            elif info.cores_percent - dev.used_cores < request.cores_percent:
                counts[f.CARD_INSUFFICIENT_CORE] += 1
            else:
                free.append(dev)
        chosen = self._choose(free, request)
        if chosen is None:
            if free:
                key = (f.ALLOCATED_CARDS_INSUFFICIENT_REQUEST if len(free) < request.nums
                       else "CardNotFoundCustomFilterRule")
                counts[key] += len(free)
            return FitOutcome(False, reason=gen_reason(counts, len(devices)))
        grant = tuple(ContainerDevice(d.info.uuid, COMMON_WORD, 0, request.cores_percent,
                                      d.info.index) for d in chosen)
        if ctx.quota_ok is not None and not ctx.quota_ok(grant):
            counts[f.RESOURCE_QUOTA_NOT_FIT] += len(grant)
            return FitOutcome(False, reason=gen_reason(counts, len(devices)))
        return FitOutcome(True, grant)

    @staticmethod
    def _choose(free: list[DeviceState], request: ContainerDeviceRequest
                ) -> list[DeviceState] | None:
        if request.cores_percent < 100:  # one core: prefer a half-used device (binpack)
            if not free:
                return None
            return [max(free, key=lambda d: (d.used_cores, -d.info.index))]
        by_index = sorted(free, key=lambda d: d.info.index)
        run: list[DeviceState] = []
        for dev in by_index:
            if run and dev.info.index != run[-1].info.index + 1:
                run = []
            run.append(dev)
            if len(run) == request.nums:
                return run
        return None

    def pod_annotations(self, grant: PodSingleDevice, ctx: PatchContext) -> dict[str, str]:
        out = super().pod_annotations(grant, ctx)
        if not out:
            return out
        out[NEURON_IDS] = ",".join(str(d.index) for container in grant for d in container)
        out[PREDICATE_NODE] = ctx.node_name
        return out
