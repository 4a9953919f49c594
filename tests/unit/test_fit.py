"""NVIDIA Fit: check order, reasons and distinct GPUs (spec §4.9, §10)."""

from __future__ import annotations

import pytest

from hami.core.fit import DeviceState, NodeOptions, PodOptions, fit_shares, gen_reason
from hami.core.model import PERCENT_UNSET, ContainerDeviceRequest, DeviceInfo


def dev(i, used_slots=0, used_mem=0, used_cores=0, split=10, mem=16000, cores=100,
        type_="NVIDIA-Tesla-T4", numa=0, health=True, mode=""):
    return DeviceState(DeviceInfo(f"GPU-{i}", i, split, mem, cores, type_, numa, mode, health),
                       used_slots, used_mem, used_cores)


def req(nums=1, mem=0, pct=PERCENT_UNSET, cores=0):
    return ContainerDeviceRequest(nums, "NVIDIA", mem, pct, cores)


POD = PodOptions()
NODE = NodeOptions()


def test_gen_reason_sorts_as_strings():
    assert gen_reason({"CardInsufficientMemory": 2, "CardUuidMismatch": 10}, 12) == \
        "10/12 CardUuidMismatch, 2/12 CardInsufficientMemory"


@pytest.mark.parametrize(("device", "request_", "pod", "node", "token"), [
    (dev(0, health=False), req(mem=1), POD, NODE, "CardNotHealth"),
    (dev(0), req(mem=1), POD, NodeOptions(cordoned=frozenset({"GPU-0"})), "CardCordoned"),
    (dev(0), req(mem=1), PodOptions(use_types=("a100",)), NODE, "CardTypeMismatch"),
    (dev(0), req(mem=1), PodOptions(nouse_types=("t4",)), NODE, "CardTypeMismatch"),
    (dev(0), req(mem=1), PodOptions(vgpu_mode="mig"), NODE, "CardTypeMismatch"),
    (dev(0), req(mem=1), PodOptions(use_uuids=frozenset({"GPU-9"})), NODE, "CardUuidMismatch"),
    (dev(0), req(mem=1), PodOptions(nouse_uuids=frozenset({"GPU-0"})), NODE, "CardUuidMismatch"),
    (dev(0, used_slots=10), req(mem=1), POD, NODE, "CardTimeSlicingExhausted"),
    (dev(0, used_slots=1), req(mem=1), PodOptions(gpu_policy="mutex"), NODE,
     "ExclusiveDeviceAllocateConflict"),
    (dev(0, used_mem=15000), req(mem=1001), POD, NODE, "CardInsufficientMemory"),
    (dev(0, used_cores=80), req(mem=1, cores=21), POD, NODE, "CardInsufficientCore"),
    (dev(0, used_slots=1, used_mem=1), req(mem=1, cores=100), POD, NODE,
     "ExclusiveDeviceAllocateConflict"),
    (dev(0, used_slots=1, used_cores=100), req(mem=1, cores=0), POD, NODE,
     "CardComputeUnitsExhausted"),
])
def test_single_check_reasons(device, request_, pod, node, token):
    outcome = fit_shares([device], request_, pod, node)
    assert not outcome.ok
    assert outcome.reason == f"1/1 {token}"


def test_first_failing_check_wins_in_hami_order():
    # unhealthy AND out of memory: health is checked first
    outcome = fit_shares([dev(0, health=False, used_mem=16000)], req(mem=1), POD, NODE)
    assert outcome.reason == "1/1 CardNotHealth"


def test_memory_exactly_at_capacity_fits_and_one_over_does_not():
    assert fit_shares([dev(0, used_mem=6000)], req(mem=10000), POD, NODE).ok
    assert not fit_shares([dev(0, used_mem=6001)], req(mem=10000), POD, NODE).ok


def test_cores_over_100_are_clamped():
    outcome = fit_shares([dev(0)], req(mem=1, cores=250), POD, NODE)
    assert outcome.ok and outcome.devices[0].used_cores_percent == 100


def test_percentage_is_per_device_and_floors():
    outcome = fit_shares([dev(0, mem=32768)], req(pct=20), POD, NODE)
    assert outcome.devices[0].used_memory_mib == 6553


def test_multi_gpu_takes_distinct_devices_in_order():
    outcome = fit_shares([dev(2), dev(0), dev(1)], req(nums=2, mem=100), POD, NODE)
    assert [d.uuid for d in outcome.devices] == ["GPU-2", "GPU-0"]


def test_not_enough_devices_reasons():
    assert fit_shares([dev(0)], req(nums=2, mem=1), POD, NODE).reason == "NodeInsufficientDevice"
    outcome = fit_shares([dev(0), dev(1, used_slots=10)], req(nums=2, mem=1), POD, NODE)
    assert outcome.reason == ("1/2 AllocatedCardsInsufficientRequest, "
                              "1/2 CardTimeSlicingExhausted")


def test_numa_bind_keeps_devices_on_one_numa_node():
    devices = [dev(0, numa=0), dev(1, numa=1), dev(2, numa=1)]
    outcome = fit_shares(devices, req(nums=2, mem=1), PodOptions(numa_bind=True), NODE)
    assert [d.uuid for d in outcome.devices] == ["GPU-1", "GPU-2"]
    fail = fit_shares([dev(0, numa=0), dev(1, numa=1)], req(nums=2, mem=1),
                         PodOptions(numa_bind=True), NODE)
    assert not fail.ok and "NumaNotFit" in fail.reason


def test_topology_aware_picks_best_linked_pair_and_loneliest_single():
    scores = {"GPU-0": {"GPU-1": 10, "GPU-2": 100}, "GPU-1": {"GPU-0": 10, "GPU-2": 50},
              "GPU-2": {"GPU-0": 100, "GPU-1": 50}}
    node = NodeOptions(pair_scores=scores)
    pod = PodOptions(gpu_policy="topology-aware")
    pair = fit_shares([dev(0), dev(1), dev(2)], req(nums=2, mem=1), pod, node)
    assert {d.uuid for d in pair.devices} == {"GPU-0", "GPU-2"}
    single = fit_shares([dev(0), dev(1), dev(2)], req(nums=1, mem=1), pod, node)
    assert [d.uuid for d in single.devices] == ["GPU-1"]


def test_topology_aware_with_only_negative_pair_scores_picks_the_least_negative_pair():
    # HAMi's score annotation allows negative pair scores; the best pair is then the least
    # negative one (dev-1 + dev-2 at -1), never an empty pick (which placed a pod on no GPU).
    scores = {"GPU-0": {"GPU-1": -5, "GPU-2": -3}, "GPU-1": {"GPU-0": -5, "GPU-2": -1},
              "GPU-2": {"GPU-0": -3, "GPU-1": -1}}
    pod = PodOptions(gpu_policy="topology-aware")
    pair = fit_shares([dev(0), dev(1), dev(2)], req(nums=2, mem=100),
                         pod, NodeOptions(pair_scores=scores))
    assert pair.ok and [d.uuid for d in pair.devices] == ["GPU-1", "GPU-2"]


def test_quota_check_blocks_device():
    outcome = fit_shares([dev(0)], req(mem=100), POD, NODE, quota_ok=lambda devs: False)
    assert outcome.reason == "1/1 ResourceQuotaNotFit"


def test_type_filter_is_case_insensitive_substring():
    assert fit_shares([dev(0)], req(mem=1), PodOptions(use_types=("tesla",)), NODE).ok
    assert fit_shares([dev(0, type_="NVIDIA-A100")], req(mem=1),
                         PodOptions(use_types=("v100", "a100")), NODE).ok


def test_pair_scores_are_read_from_the_vendor_s_key_only():
    """Issue 16: the pair-score annotation is the vendor's (``CardFilters.node_scores``),
    not a key the core knows; without a key no scores are read."""
    raw = '[{"uuid":"GPU-0","score":{"GPU-1":200}}]'
    anns = {"example.com/pair-scores": raw, "hami.io/node-nvidia-score": raw}
    mine = NodeOptions.from_annotations(anns, "example.com/pair-scores")
    assert mine.pair_scores == {"GPU-0": {"GPU-1": 200}}
    assert NodeOptions.from_annotations(anns).pair_scores == {}
    assert NodeOptions.from_annotations({"k": "not json"}, "k").pair_scores == {}
