from __future__ import annotations

import math

import pytest

from hami.core.fragmentation import WorkloadDistribution
from hami.core.ledger import UsageLedger
from hami.core.model import ContainerDevice, DeviceInfo
from hami.sim import metrics


def cluster() -> UsageLedger:
    led = UsageLedger()
    led.add_node("n0", [DeviceInfo(f"g{i}", i, 20, 16384, 100, "NVIDIA-T4") for i in range(2)],
                 cpu_milli=4000, memory_mib=8192)
    led.add_node("n1", [DeviceInfo("h0", 0, 20, 16384, 100, "NVIDIA-T4")],
                 cpu_milli=4000, memory_mib=8192)
    return led


def test_allocation_and_fragmentation_by_hand() -> None:
    led = cluster()
    led.add_pod("p", "n0", ((ContainerDevice("g0", "NVIDIA", 13271, 81),),), cpu_milli=1000)
    led.add_pod("q", "n1", ((ContainerDevice("h0", "NVIDIA", 8192, 50),),), cpu_milli=4000)
    assert metrics.capacity_milli(led) == 3000
    assert metrics.allocated_milli(led) == 1310
    assert metrics.allocation_percent(led) == pytest.approx(1310 / 30)
    assert metrics.idle_milli(led) == 1690
    # Workload: half-GPU tasks needing 1000m CPU.  n0: GPU g0 has 190 free (< 500): 190
    # is fragmented, g1 (1000) is usable.  n1: no CPU left, all its 500 free GPU is.
    dist = WorkloadDistribution.from_tasks([1], [500], [1000], [0])
    assert metrics.fragmentation_milli(led, dist) == pytest.approx(190 + 500)
    assert metrics.node_types(led) == ["NVIDIA-T4", "NVIDIA-T4"]


def test_median_curve_skips_nan() -> None:
    got = metrics.median_curve([{10: 1.0, 20: math.nan}, {10: 3.0, 20: math.nan},
                                {10: 2.0, 20: 5.0}])
    assert got == {10: 2.0, 20: 5.0}
    assert math.isnan(metrics.median_curve([{10: math.nan}])[10])
    assert metrics.unallocated_curve({10: 96.5}) == {10: pytest.approx(3.5)}
