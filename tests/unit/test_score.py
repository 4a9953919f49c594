"""GPU policies and device scores (spec §4.6, §4.7), field case B12."""

from __future__ import annotations

import pytest

from hami.core.codec import CodecError, ScoringWeights, parse_scoring_weights
from hami.core.fit import DeviceState, PodOptions
from hami.core.model import ContainerDeviceRequest, DeviceInfo
from hami.core.score import device_score, order_devices

REQ = ContainerDeviceRequest(1, "NVIDIA", 1000, 101, 10)


def dev(i, used=0, numa=0):
    return DeviceState(DeviceInfo(f"GPU-{i}", i, 10, 10000, 100, "NVIDIA-A10", numa),
                       used, used * 1000, used * 10)


def order(devices, policy, numa_bind=False, weights=ScoringWeights()):
    pod = PodOptions(gpu_policy=policy, numa_bind=numa_bind)
    return [d.info.index for d in order_devices(devices, REQ, pod, weights)]


def test_device_score_counts_request_and_usage():
    assert device_score(dev(0, used=2), REQ, ScoringWeights()) == pytest.approx(
        10 * (3 / 10 + 30 / 100 + 3000 / 10000))


def test_spread_prefers_least_used_binpack_most_used():
    devices = [dev(0, 3), dev(1, 1), dev(2, 5)]
    assert order(devices, "spread") == [1, 0, 2]
    assert order(devices, "binpack") == [2, 0, 1]


def test_ties_resolve_like_hami_higher_index_first():
    assert order([dev(0), dev(1), dev(2)], "spread") == [2, 1, 0]


def test_mutex_prefers_idle():
    assert order([dev(0, 2), dev(1, 0), dev(2, 1)], "mutex")[0] == 1


def test_chain_policy_numa_then_binpack():
    devices = [dev(0, 1, numa=1), dev(1, 3, numa=0), dev(2, 2, numa=0)]
    # chain: numa ascending is "worst first", so best first = higher numa first
    assert order(devices, "numa,binpack") == [0, 1, 2]


def test_weights_change_ranking():
    a = DeviceState(DeviceInfo("A", 0, 10, 10000, 100, "NVIDIA"), 5, 0, 0)
    b = DeviceState(DeviceInfo("B", 1, 10, 10000, 100, "NVIDIA"), 0, 5000, 0)
    slot_only = order([a, b], "binpack", weights=ScoringWeights(1, 0, 0))
    mem_only = order([a, b], "binpack", weights=ScoringWeights(0, 0, 1))
    assert slot_only[0] == 0 and mem_only[0] == 1


def test_b12_numa_only_breaks_ties():
    """B12: the NUMA node only breaks ties; spread takes the idlest card even on another NUMA node."""
    # four 40 GiB A100s, two per NUMA node, loaded 90 % / 70 % / 30 % / 10 %
    # (index, numa, used slots, used MiB, used cores)
    load = [(0, 0, 5, 36000, 90), (1, 0, 4, 28000, 70), (2, 1, 2, 12000, 30), (3, 1, 1, 4000, 10)]
    devices = [DeviceState(DeviceInfo(f"GPU-{i}", i, 10, 40960, 100, "NVIDIA-A100-40GB", numa),
                           slots, mem, cores) for i, numa, slots, mem, cores in load]
    request = ContainerDeviceRequest(1, "NVIDIA", 4000, 101, 5)
    spread = order_devices(devices, request, PodOptions(gpu_policy="spread"), ScoringWeights())
    binpack = order_devices(devices, request, PodOptions(gpu_policy="binpack"), ScoringWeights())
    assert spread[0].info.uuid == "GPU-3"
    assert binpack[0].info.uuid == "GPU-0"


@pytest.mark.parametrize(("value", "expected"), [
    ("slot=1,core=2,memory=3", ScoringWeights(1, 2, 3)),
    (" memory = 0 , slot=5,core=0", ScoringWeights(5, 0, 0)),
])
def test_weights_parse(value, expected):
    assert parse_scoring_weights(value) == expected


@pytest.mark.parametrize(("value", "text"), [
    ("slot=1,core=2", "expected slot, core, and memory weights"),
    ("slot=1,core,memory=1", "expected key=value entries"),
    ("slot=x,core=1,memory=1", '"slot" weight must be an integer'),
    ("slot=-1,core=1,memory=1", '"slot" weight must not be negative'),
    ("slot=1,gpu=1,memory=1", 'unknown weight "gpu"'),
    ("slot=1,slot=1,memory=1", 'duplicate "slot" weight'),
    ("slot=0,core=0,memory=0", "at least one weight must be positive"),
])
def test_weights_errors(value, text):
    with pytest.raises(CodecError, match=text):
        parse_scoring_weights(value)
