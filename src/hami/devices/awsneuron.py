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
from hami.core.fit import DeviceState, FitOutcome
from hami.core.model import ContainerDevice, ContainerDeviceRequest, PodSingleDevice
from hami.core.vendor import FitContext, PatchContext, ResourceNames
from hami.devices.cardfit import finish_pick, indices, screened, too_few
from hami.devices.common import AdmissionError, Filters, in_limits, int_resource
from hami.devices.shares import WholeCardVendor, WholeRow

COMMON_WORD = "AWSNeuron"
CORES_PER_DEVICE = 2
HALF = 100 // CORES_PER_DEVICE
NEURON_IDS = "AWS_NEURON_IDS"
PREDICATE_NODE = "aws.amazon.com/predicate-node"
#: Devices from the capacity of the count resource, two cores (share slots) each.
ROW = WholeRow(COMMON_WORD, "hami.io/node-handshake-awsneuron",
               "hami.io/aws-neuron-devices-allocated", None, "aws.amazon.com/neuron",
               COMMON_WORD, Filters(use_uuid="aws.amazon.com/use-gpuuuid",
                                    nouse_uuid="aws.amazon.com/nouse-gpuuuid"),
               split=CORES_PER_DEVICE)


@dataclass(frozen=True, slots=True)
class NeuronConfig:
    """The ``awsneuron:`` section (HAMi v2.10)."""

    resource_count_name: str = ROW.count_name
    resource_core_name: str = "aws.amazon.com/neuroncore"


def devices_for_cores(cores: int) -> tuple[int, int]:
    """``(devices, cores percent per device)`` for a ``neuroncore`` request: 1 core is
    half a device; an even number is whole devices; anything else is refused."""
    if cores == 1:
        return 1, HALF
    if cores > 0 and cores % CORES_PER_DEVICE == 0:
        return cores // CORES_PER_DEVICE, 100
    raise AdmissionError(f"aws.amazon.com/neuroncore must be 1 or an even number, got {cores}")


class AwsNeuron(WholeCardVendor):
    """AWS Inferentia/Trainium devices and core groups."""

    def __init__(self, config: NeuronConfig | None = None) -> None:
        self.neuron = config or NeuronConfig()
        super().__init__(ROW, self.neuron.resource_count_name)

    def resource_names(self) -> ResourceNames:
        return ResourceNames(self.count_name, "", self.neuron.resource_core_name)

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        self.container_request(container)
        return (in_limits(container, self.count_name)
                or in_limits(container, self.neuron.resource_core_name))

    def container_request(self, container: Mapping[str, Any]) -> ContainerDeviceRequest | None:
        nums = int_resource(container, self.count_name)
        if nums:
            return ContainerDeviceRequest(nums, COMMON_WORD, 0, 100, 100)
        cores = int_resource(container, self.neuron.resource_core_name)
        if not cores:
            return None
        count, share = devices_for_cores(cores)
        return ContainerDeviceRequest(count, COMMON_WORD, 0, 100, share)

    def fit(self, devices: Sequence[DeviceState], request: ContainerDeviceRequest,
            ctx: FitContext) -> FitOutcome:
        if (short := too_few(devices, request.nums)) is not None:
            return short
        counts: Counter[str] = Counter()
        free: list[DeviceState] = []
        for dev in screened(devices, ctx, self.filters, counts):
            if dev.info.cores_percent - dev.used_cores < request.cores_percent:
                counts[f.CARD_INSUFFICIENT_CORE] += 1
            else:
                free.append(dev)
        chosen = self._choose(free, request)
        grant = None if chosen is None else tuple(
            ContainerDevice(d.info.uuid, COMMON_WORD, 0, request.cores_percent, d.info.index)
            for d in chosen)
        return finish_pick(counts, len(free), request.nums, len(devices), grant, ctx)

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
        if out:
            out.update({NEURON_IDS: indices(grant), PREDICATE_NODE: ctx.node_name})
        return out
