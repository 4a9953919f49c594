"""AWS Neuron (spec §9: neuroncore 1 or even, devices from capacity, AWS_NEURON_IDS,
predicate-node; HAMi guide: one core is half a device, ``<node>-AWSNeuron-<i>``)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.awsneuron import AwsNeuron, devices_for_cores
from hami.devices.common import AdmissionError
from tests.devices.util import ctr, node, state

A = AwsNeuron()


@pytest.mark.parametrize(("cores", "want"), [(1, (1, 50)), (2, (1, 100)), (4, (2, 100)),
                                             (8, (4, 100))])
def test_core_groups(cores: int, want: tuple[int, int]) -> None:
    assert devices_for_cores(cores) == want


@pytest.mark.parametrize("cores", [3, 5, 7])
def test_odd_core_groups_refused(cores: int) -> None:
    with pytest.raises(AdmissionError, match="1 or an even number"):
        A.mutate_admission(ctr({"aws.amazon.com/neuroncore": cores}), {})


@pytest.mark.parametrize(("limits", "want"), [
    ({"aws.amazon.com/neuron": 2}, ContainerDeviceRequest(2, "AWSNeuron", 0, 100, 100)),
    ({"aws.amazon.com/neuroncore": 1}, ContainerDeviceRequest(1, "AWSNeuron", 0, 100, 50)),
    ({"aws.amazon.com/neuroncore": 4}, ContainerDeviceRequest(2, "AWSNeuron", 0, 100, 100)),
    ({}, None),
])
def test_requests(limits: dict[str, int], want: ContainerDeviceRequest | None) -> None:
    assert A.container_request(ctr(limits)) == want


DEVS = A.node_devices(node("ip-1", capacity={"aws.amazon.com/neuron": 4}))


def test_devices_from_capacity() -> None:
    assert [d.uuid for d in DEVS] == [f"ip-1-AWSNeuron-{i}" for i in range(4)]


def test_half_device_binpacks_onto_a_half_used_device() -> None:
    used = {"ip-1-AWSNeuron-2": (1, 0, 50)}
    out = A.fit(state(DEVS, used), ContainerDeviceRequest(1, "AWSNeuron", 0, 100, 50),
                FitContext())
    assert [d.uuid for d in out.devices] == ["ip-1-AWSNeuron-2"]


@pytest.mark.parametrize(("used", "nums", "want"), [
    ((), 2, [0, 1]), ((1,), 2, [2, 3]), ((1,), 3, None), ((0, 3), 2, [1, 2]), ((), 4, [0, 1, 2, 3]),
])
def test_whole_devices_are_consecutive(used: tuple[int, ...], nums: int,
                                       want: list[int] | None) -> None:
    u = {f"ip-1-AWSNeuron-{i}": (1, 0, 50) for i in used}
    out = A.fit(state(DEVS, u), ContainerDeviceRequest(nums, "AWSNeuron", 0, 100, 100),
                FitContext())
    if want is None:
        assert not out.ok and "CardInsufficientCore" in out.reason
    else:
        assert [d.index for d in out.devices] == want


def test_annotations() -> None:
    out = A.fit(state(DEVS), ContainerDeviceRequest(2, "AWSNeuron", 0, 100, 100), FitContext())
    anns = A.pod_annotations(((), out.devices), PatchContext("ip-1"))
    assert anns["AWS_NEURON_IDS"] == "0,1"
    assert anns["aws.amazon.com/predicate-node"] == "ip-1"
    assert anns["hami.io/aws-neuron-devices-allocated"].startswith(";ip-1-AWSNeuron-0,")
    assert "hami.io/aws-neuron-devices-to-allocate" not in anns
