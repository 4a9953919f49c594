"""A pod asking for two vendors in different containers is placed consistently
(issue 7 §3; spec §1.3 Resourcereqs, §3 step 4, §4.4, §4.5, §2.2)."""

from __future__ import annotations

from typing import Any

from hami.core.fit import DeviceState
from hami.core.model import ContainerDevice
from hami.core.vendor import PatchContext
from hami.core.vendors import merge_allocation, mutate_pod, pod_patch, pod_requests
from hami.devices.allocate import (
    DEVICE_TYPE_NOT_FOUND,
    NodeView,
    choose_node,
    default_node_score,
    fit_pod,
)
from hami.devices.registry import build_registry
from tests.devices.util import ctr, dev, pod, state

REG = build_registry({"nvidia": {}, "hygon": {}, "cambricon": {}, "mthreads": {}})

NODE_DEVICES = [
    dev("GPU-0", "NVIDIA", kind="NVIDIA-A100", memory=40960, index=0),
    dev("GPU-1", "NVIDIA", kind="NVIDIA-A100", memory=40960, index=1),
    dev("DCU-0", "DCU", kind="DCU-Z100", memory=65520, index=0),
    dev("MLU-0", "MLU", memory=24576, index=0),
]

POD = pod(
    ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000}, name="dcu-app"),
    ctr({"cpu": 1}, name="sidecar"),
    ctr({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000}, name="cuda-app"),
    init=[ctr({"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 4}, name="mlu-init")],
)


def test_requests_per_container_and_vendor() -> None:
    reqs = pod_requests(REG, POD)
    assert reqs.n_init == 1
    assert [sorted(c) for c in reqs.containers] == [["MLU"], ["DCU"], [], ["NVIDIA"]]
    assert reqs.vendors == ("DCU", "MLU", "NVIDIA")


def test_webhook_calls_every_vendor_on_every_container() -> None:
    p: dict[str, Any] = pod(ctr({"nvidia.com/gpu": 1}), ctr({"mthreads.com/vgpu": 1}))
    assert mutate_pod(REG, p) is True
    assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == 100
    assert p["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "1"
    assert mutate_pod(REG, pod(ctr({"cpu": 1}))) is False


def test_two_vendor_pod_is_consistent() -> None:
    reqs = pod_requests(REG, POD)
    out = fit_pod(REG, reqs, state(NODE_DEVICES), node_name="n1")
    assert out.ok, out.reason
    assert sorted(out.devices) == ["DCU", "MLU", "NVIDIA"]
    for word, grant in out.devices.items():
        assert len(grant) == 4  # one entry per container, init first
        for position, container in enumerate(grant):
            wanted = word in reqs.containers[position]
            assert bool(container) is wanted
            assert all(d.type == word for d in container)
    assert {d.uuid for d in out.devices["NVIDIA"][3]} == {"GPU-0", "GPU-1"}
    assert out.devices["DCU"][1] == (ContainerDevice("DCU-0", "DCU", 2000, 0),)
    assert out.devices["MLU"][0] == (ContainerDevice("MLU-0", "MLU", 1024, 0),)
    anns = pod_patch(REG, out.devices, PatchContext("n1", 7))
    assert anns["hami.io/dcu-devices-allocated"] == ";DCU-0,DCU,2000,0:;;;"
    assert anns["hami.io/cambricon-mlu-devices-allocated"] == "MLU-0,MLU,1024,0:;;;;"
    nv = anns["hami.io/vgpu-devices-allocated"]
    assert nv.startswith(";;;") and nv.count("NVIDIA,3000,0:") == 2
    assert anns["CAMBRICON_DSMLU_PROFILE"] == "0_0_4"
    # each vendor's string decodes back to the same positional allocation
    for word, grant in out.devices.items():
        decoded = REG[word].decode_allocation(anns)
        assert tuple(tuple(d.uuid for d in c) for c in decoded) == tuple(
            tuple(d.uuid for d in c) for c in grant)


def test_app_containers_accumulate_across_vendors_independently() -> None:
    p = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 40000}, name="a"),
            ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 40000}, name="b"),
            ctr({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000}, name="c"))
    out = fit_pod(REG, pod_requests(REG, p), state(NODE_DEVICES))
    assert not out.ok and out.reason == "1/1 CardInsufficientMemory"
    q = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 30000}, name="a"),
            ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 30000}, name="b"),
            ctr({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000}, name="c"))
    assert fit_pod(REG, pod_requests(REG, q), state(NODE_DEVICES)).ok


def test_init_containers_use_fresh_copies() -> None:
    p = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 60000}, name="app"),
            init=[ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 60000}, name="i")])
    out = fit_pod(REG, pod_requests(REG, p), state(NODE_DEVICES))
    assert out.ok and out.devices["DCU"][0] and out.devices["DCU"][1]


def test_devices_are_not_modified() -> None:
    devices = state(NODE_DEVICES)
    fit_pod(REG, pod_requests(REG, POD), devices)
    assert all(d.used_slots == 0 for d in devices)


def test_unknown_vendor_and_missing_devices() -> None:
    only_nvidia = build_registry({"nvidia": {}})
    reqs = pod_requests(REG, POD)
    assert fit_pod(only_nvidia, reqs, state(NODE_DEVICES)).reason == DEVICE_TYPE_NOT_FOUND
    no_dcu = [d for d in NODE_DEVICES if d.vendor != "DCU"]
    assert fit_pod(REG, reqs, state(no_dcu)).reason == "NodeInsufficientDevice"


def test_default_node_score_over_all_vendors() -> None:
    devices = [DeviceState(d, 0, 0, 0) for d in NODE_DEVICES]
    assert default_node_score(devices) == 0.0
    devices[2].used_slots, devices[2].used_cores = 2, 100
    score = default_node_score(devices)
    assert abs(score - 10 * (2 / 40 + 100 / 400)) < 1e-5


def test_merge_allocation_for_the_ledger() -> None:
    out = fit_pod(REG, pod_requests(REG, POD), state(NODE_DEVICES))
    merged = merge_allocation(out.devices, 4)
    assert [sorted(d.uuid for d in c) for c in merged] == [
        ["MLU-0"], ["DCU-0"], [], ["GPU-0", "GPU-1"]]


def test_choose_node_across_nodes() -> None:
    reqs = pod_requests(REG, POD)
    empty = NodeView("empty", state(NODE_DEVICES))
    busy = NodeView("busy", state(NODE_DEVICES, {"GPU-0": (1, 1000, 0)}))
    no_mlu = NodeView("no-mlu", state([d for d in NODE_DEVICES if d.vendor != "MLU"]))
    binpack = choose_node(REG, reqs, [empty, busy, no_mlu])
    assert binpack.node == "busy" and binpack.score > 0
    spread = choose_node(REG, reqs, [empty, busy, no_mlu], node_policy="spread")
    assert spread.node == "empty"
    none = choose_node(REG, reqs, [no_mlu])
    assert none.node is None and none.failed == {"no-mlu": "NodeInsufficientDevice"}


def test_webhook_error_names_the_vendor_value() -> None:
    import pytest

    from hami.devices.common import AdmissionError
    with pytest.raises(AdmissionError, match="mthreads.com/sgpu-memory"):
        mutate_pod(REG, pod(ctr({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 3})))


def test_pod_patch_refuses_conflicting_keys() -> None:
    import pytest

    from hami.devices.common import Filters
    from hami.devices.countonly import CountOnlyVendor
    a = CountOnlyVendor("Same", "x/a", "r", "h", Filters())
    b = CountOnlyVendor("Same", "x/b", "r", "h", Filters())
    reg = {"A": a, "B": b}
    grant_a = ((ContainerDevice("u1", "Same", 1, 0),),)
    grant_b = ((ContainerDevice("u2", "Same", 1, 0),),)
    with pytest.raises(ValueError, match="disagree"):
        pod_patch(reg, {"A": grant_a, "B": grant_b}, PatchContext())
    assert pod_patch(reg, {"A": grant_a, "B": grant_a}, PatchContext())
