"""A pod asking for two vendors in different containers is placed consistently
(issue 7 §3; spec §1.3 Resourcereqs, §3 step 4, §4.4, §4.5, §2.2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.core.config import SchedulingPolicy
from hami.core.model import ContainerDevice, DeviceInfo
from hami.core.state import ClusterState, Decision
from hami.core.vendor import PatchContext
from hami.core.vendors import merge_allocation, mutate_pod, pod_patch, pod_requests
from hami.devices.registry import Registry, build_registry, make_config
from tests.devices.util import ctr, dev, pod

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


def cluster(nodes: Mapping[str, Sequence[DeviceInfo]], registry: Registry = REG,
            node_policy: str = "binpack") -> ClusterState:
    """The scheduler's state with ``nodes`` (name -> every vendor's devices)."""
    st = ClusterState(make_config(registry=registry,
                                      policy=SchedulingPolicy(node_policy, "spread")))
    for name, devices in nodes.items():
        st.ledger.add_node(name, devices)
    return st


def decide(st: ClusterState, p: dict[str, Any], *node_names: str) -> Decision:
    """The filter's decision for ``p`` among ``node_names`` (all nodes when none)."""
    return st.filter(p, list(node_names) or st.ledger.node_names())


def grants(decision: Decision) -> dict[str, Any]:
    """Every vendor's grant of a decision, NVIDIA's included."""
    return {**decision.result.vendor_devices, "NVIDIA": decision.result.devices}


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
    decision = decide(cluster({"n1": NODE_DEVICES}), POD)
    assert decision.result.node == "n1", decision.result.failed_nodes
    out = grants(decision)
    assert sorted(decision.result.vendor_devices) == ["DCU", "MLU"]
    for word, grant in out.items():
        assert len(grant) == 4  # one entry per container, init first
        for position, container in enumerate(grant):
            wanted = word in reqs.containers[position]
            assert bool(container) is wanted
            assert all(d.type == word for d in container)
    assert {d.uuid for d in out["NVIDIA"][3]} == {"GPU-0", "GPU-1"}
    assert out["DCU"][1] == (ContainerDevice("DCU-0", "DCU", 2000, 0),)
    assert out["MLU"][0] == (ContainerDevice("MLU-0", "MLU", 1024, 0),)
    anns = decision.annotations
    assert anns["hami.io/dcu-devices-allocated"] == ";DCU-0,DCU,2000,0:;;;"
    assert anns["hami.io/cambricon-mlu-devices-allocated"] == "MLU-0,MLU,1024,0:;;;;"
    nv = anns["hami.io/vgpu-devices-allocated"]
    assert nv.startswith(";;;") and nv.count("NVIDIA,3000,0:") == 2
    assert anns["CAMBRICON_DSMLU_PROFILE"] == "0_0_4"
    # each vendor's string decodes back to the same positional allocation
    for word, grant in out.items():
        decoded = REG[word].decode_allocation(anns)
        assert tuple(tuple(d.uuid for d in c) for c in decoded) == tuple(
            tuple(d.uuid for d in c) for c in grant)


def test_app_containers_accumulate_across_vendors_independently() -> None:
    p = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 40000}, name="a"),
            ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 40000}, name="b"),
            ctr({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000}, name="c"))
    out = decide(cluster({"n1": NODE_DEVICES}), p).result
    assert out.node is None and out.failed_nodes == {"n1": "1/1 CardInsufficientMemory"}
    q = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 30000}, name="a"),
            ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 30000}, name="b"),
            ctr({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 40000}, name="c"))
    assert decide(cluster({"n1": NODE_DEVICES}), q).result.node == "n1"


def test_init_containers_use_fresh_copies() -> None:
    p = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 60000}, name="app"),
            init=[ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 60000}, name="i")])
    out = decide(cluster({"n1": NODE_DEVICES}), p).result
    assert out.node == "n1"
    assert out.vendor_devices["DCU"][0] and out.vendor_devices["DCU"][1]


def test_the_filter_does_not_charge() -> None:
    st = cluster({"n1": NODE_DEVICES})
    assert decide(st, POD).result.node == "n1"
    assert all(used == 0 for _, used, _, _ in st.ledger.device_usage("n1"))


def test_missing_devices() -> None:
    no_dcu = [d for d in NODE_DEVICES if d.vendor != "DCU"]
    out = decide(cluster({"n1": no_dcu}), POD).result
    assert out.failed_nodes == {"n1": "NodeInsufficientDevice"}


def test_default_node_score_over_all_vendors() -> None:
    # binpack: usage of another vendor's device counts in the node score (HAMi's
    # ComputeDefaultScore sums every device of the node), so the node with a busy DCU
    # wins an NVIDIA-only pod; spread takes the idle node.
    st = cluster({"idle": NODE_DEVICES, "dcu-busy": NODE_DEVICES}, node_policy="binpack")
    dcu = pod(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000}))
    dcu["metadata"]["uid"] = "dcu"
    assert st.commit(dcu, decide(st, dcu, "dcu-busy")) is not None
    gpu = pod(ctr({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}))
    assert decide(st, gpu).result.node == "dcu-busy"
    st.config = make_config(registry=REG, policy=SchedulingPolicy("spread", "spread"))
    assert decide(st, gpu).result.node == "idle"


def test_merge_allocation_for_the_ledger() -> None:
    out = grants(decide(cluster({"n1": NODE_DEVICES}), POD))
    merged = merge_allocation(out, 4)
    assert [sorted(d.uuid for d in c) for c in merged] == [
        ["MLU-0"], ["DCU-0"], [], ["GPU-0", "GPU-1"]]


def test_choose_node_across_nodes() -> None:
    no_mlu = [d for d in NODE_DEVICES if d.vendor != "MLU"]
    nodes = {"empty": NODE_DEVICES, "busy": NODE_DEVICES, "no-mlu": no_mlu}
    for policy, chosen in (("binpack", "busy"), ("spread", "empty")):
        st = cluster(nodes, node_policy=policy)
        first = pod(ctr({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}))
        first["metadata"]["uid"] = "first"
        st.commit(first, decide(st, first, "busy"))
        decision = decide(st, POD)
        assert decision.result.node == chosen, policy
        assert decision.result.score > 0 or policy == "spread"
    st = cluster({"no-mlu": no_mlu})
    none = decide(st, POD).result
    assert none.node is None and none.failed_nodes == {"no-mlu": "NodeInsufficientDevice"}


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
