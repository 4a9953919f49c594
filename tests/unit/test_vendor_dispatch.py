"""Every backend of the registry is reachable through the core (issue 7 §3): for each
CommonWord, one pod is scheduled through :class:`ClusterState` on a node that has only
that vendor's devices; the annotations it writes are the vendor's, decode back to the
grant, and a fresh ClusterState rebuilt from the pod (a scheduler restart) charges the
same usage."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from hami.core.state import ClusterState
from hami.devices.registry import build_registry, make_config

DEVICE_CONFIG: dict[str, Any] = {
    "nvidia": {}, "hygon": {}, "cambricon": {}, "mthreads": {}, "amd": {}, "awsneuron": {},
    "kunlun": {}, "metax": {}, "enflame": {}, "vastai": {}, "biren": {},
    "iluvatars": [{"chipName": "MR-V100", "commonWord": "MR-V100"}],
    "vnpus": [{"chipName": "910B3", "commonWord": "Ascend910B3", "aiCore": 20,
               "templates": [{"name": "vir05_1c_16g", "memory": 16384, "aiCore": 5},
                             {"name": "vir10_3c_32g", "memory": 32768, "aiCore": 10}]}],
}
REGISTRY = build_registry(DEVICE_CONFIG, enable_ascend=True, enable_iluvatar=True)


def reg(*devices: tuple[str, int, int, str]) -> str:
    """A JSON register annotation (spec §2.3) for ``(id, count, devmem, type)``."""
    return json.dumps([{"id": i, "index": n, "count": c, "devmem": m, "devcore": 100,
                        "type": t, "health": True} for n, (i, c, m, t) in enumerate(devices)])


# CommonWord -> (node annotations, node capacity, container limits, pod annotations,
#                annotation keys the scheduler must write besides hami.io/vgpu-node)
CASES: dict[str, tuple[dict[str, str], dict[str, Any], dict[str, Any], dict[str, str],
                       set[str]]] = {
    "NVIDIA": ({"hami.io/node-nvidia-register": reg(("GPU-0", 10, 16384, "NVIDIA-T4"))}, {},
               {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, {},
               {"hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated"}),
    "DCU": ({"hami.io/node-dcu-register": "DCU-0,10,65520,100,DCU-Z100,0,true,0,hami-core:"},
            {}, {"hygon.com/dcunum": 1, "hygon.com/dcumem": 1000}, {},
            {"hami.io/dcu-devices-to-allocate", "hami.io/dcu-devices-allocated"}),
    "MLU": ({}, {"cambricon.com/mlu.smlu.vcore": 100, "cambricon.com/mlu.smlu.vmemory": 96},
            {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 4}, {},
            {"hami.io/cambricon-mlu-devices-to-allocate", "hami.io/cambricon-mlu-devices-allocated",
             "CAMBRICON_DSMLU_PROFILE", "CAMBRICON_DSMLU_ASSIGNED"}),
    "Mthreads": ({}, {"mthreads.com/sgpu-core": 16, "mthreads.com/sgpu-memory": 96},
                 {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 4}, {},
                 {"hami.io/mthreads-vgpu-devices-allocated", "mthreads.com/gpu-index",
                  "mthreads.com/predicate-time", "mthreads.com/predicate-node"}),
    "AMD": ({"hami.io/node-amd-register": reg(("amd-0", 10, 196608, "AMD-MI300X"))}, {},
            {"amd.com/gpu": 1, "amd.com/gpumem": 1000, "amd.com/gpucores": 50}, {},
            {"hami.io/amd-devices-to-allocate", "hami.io/amd-devices-allocated"}),
    "AWSNeuron": ({}, {"aws.amazon.com/neuron": 2}, {"aws.amazon.com/neuroncore": 1}, {},
                  {"hami.io/aws-neuron-devices-allocated", "AWS_NEURON_IDS",
                   "aws.amazon.com/predicate-node"}),
    "kunlun": ({}, {"kunlunxin.com/xpu": 8}, {"kunlunxin.com/xpu": 2}, {},
               {"hami.io/kunlun-allocated", "BAIDU_COM_DEVICE_IDX"}),
    "XPU": ({"hami.io/node-register-xpu": reg(("xpu-0", 4, 98304, "XPU"))}, {},
            {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 20000}, {},
            {"hami.io/xpu-devices-to-allocate", "hami.io/xpu-devices-allocated"}),
    "Metax-GPU": ({}, {"metax-tech.com/gpu": 2}, {"metax-tech.com/gpu": 1}, {},
                  {"hami.io/metax-gpu-devices-to-allocate", "hami.io/metax-gpu-devices-allocated"}),
    "Metax-SGPU": ({"metax-tech.com/node-gpu-devices": reg(("mx-0", 16, 65536, "C500"))}, {},
                   {"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 4,
                    "metax-tech.com/vcore": 60}, {},
                   {"hami.io/metax-sgpu-devices-to-allocate",
                    "hami.io/metax-sgpu-devices-allocated"}),
    "GCU": ({}, {"enflame.com/gcu": 2}, {"enflame.com/gcu": 1}, {},
            {"hami.io/enflame-gcu-devices-to-allocate", "hami.io/enflame-gcu-devices-allocated"}),
    "Enflame": ({}, {"enflame.com/vgcu-percentage": 200},
                {"enflame.com/vgcu": 1, "enflame.com/vgcu-percentage": 25}, {},
                {"hami.io/enflame-vgpu-devices-allocated", "enflame.com/gcu-assigned"}),
    "Vastai": ({"hami.io/node-va-register": reg(("va-0", 4, 32768, "VA1"))}, {},
               {"vastaitech.com/va": 1}, {},
               {"hami.io/Vastai-devices-to-allocate", "hami.io/Vastai-devices-allocated"}),
    "Biren": ({"hami.io/node-biren-register": reg(("br-0", 4, 32768, "BR104"))}, {},
              {"birentech.com/gpu": 1}, {},
              {"hami.io/Biren-devices-to-allocate", "hami.io/Biren-devices-allocated"}),
    "MR-V100": ({"hami.io/node-MR-V100-register": "il-0,4,32768,100,MR-V100,0,true,0,hami-core:"},
                {}, {"iluvatar.ai/MR-V100-vgpu": 1, "iluvatar.ai/MR-V100.vMem": 16}, {},
                {"hami.io/MR-V100-devices-to-allocate", "hami.io/MR-V100-devices-allocated"}),
    "Ascend910B3": ({"hami.io/node-register-Ascend910B3": reg(("npu-0", 4, 65536, "Ascend910B3"))},
                    {}, {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 10000},
                    {}, {"hami.io/Ascend910B3-devices-to-allocate",
                         "hami.io/Ascend910B3-devices-allocated", "huawei.com/Ascend910B3",
                         "predicate-time"}),
}


def test_every_registered_vendor_has_a_case() -> None:
    assert sorted(CASES) == sorted(REGISTRY)


def _node(word: str, annotations: Mapping[str, str], capacity: Mapping[str, Any]
          ) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": f"node-{word}", "annotations": dict(annotations)},
            "status": {"capacity": dict(capacity), "allocatable": dict(capacity)}}


def _pod(word: str, limits: Mapping[str, Any], annotations: Mapping[str, str]) -> dict[str, Any]:
    return {"kind": "Pod",
            "metadata": {"name": f"pod-{word.lower()}", "namespace": "ns", "uid": f"uid-{word}",
                         "annotations": dict(annotations)},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": dict(limits)}}]}}


@pytest.mark.parametrize("word", sorted(CASES))
def test_vendor_pod_through_cluster_state(word: str) -> None:
    node_anns, capacity, limits, pod_anns, keys = CASES[word]
    state = ClusterState(make_config(registry=REGISTRY))
    # a node of every other vendor too, so the pod must find its own vendor's node
    for other, (anns, cap, *_rest) in CASES.items():
        assert state.upsert_node(_node(other, anns, cap)) == "", other
    pod = _pod(word, limits, pod_anns)
    decision = state.filter(pod, sorted(f"node-{w}" for w in CASES), now_ns=1_700_000_000_000_000_000)
    assert decision.result.node == f"node-{word}", decision.result.failed_nodes
    anns = decision.annotations
    assert set(anns) == keys | {"hami.io/vgpu-node"}
    vendor = REGISTRY[word]
    granted = decision.result.devices if word == "NVIDIA" else decision.result.vendor_devices[word]
    assert _same(vendor.decode_allocation(anns), granted)
    entry = state.commit(pod, decision)
    assert entry is not None
    used = {u[0].uuid: u[1:] for u in state.ledger.device_usage(f"node-{word}")}
    uuids = {d.uuid for c in granted for d in c}
    assert uuids and all(used[u][0] >= 1 for u in uuids)
    # restart: a new scheduler reads the node and the annotated pod back
    again = ClusterState(make_config(registry=REGISTRY))
    again.upsert_node(_node(word, node_anns, capacity))
    bound = {**pod, "metadata": {**pod["metadata"], "annotations": {**pod_anns, **anns}}}
    assert again.upsert_pod(bound) is True
    assert again.ledger.device_usage(f"node-{word}") == state.ledger.device_usage(f"node-{word}")


def _same(decoded: Any, granted: Any) -> bool:
    def key(alloc: Any) -> list[list[tuple[str, int, int]]]:
        return [[(d.uuid, d.used_memory_mib, d.used_cores_percent) for d in c]
                for c in alloc if c]
    return key(decoded) == key(granted)


# ----------------------------------------------------------- ClusterState details
MIXED_NODE = _node("mixed", {**CASES["NVIDIA"][0], **CASES["DCU"][0]}, {})


def test_a_malformed_vendor_annotation_drops_only_that_vendor() -> None:
    state = ClusterState(make_config(registry=REGISTRY))
    bad = _node("mixed", {**CASES["NVIDIA"][0], "hami.io/node-dcu-register": "no separator"}, {})
    assert state.upsert_node(bad) == ""
    assert [d.vendor for d, *_ in state.ledger.device_usage("node-mixed")] == ["NVIDIA"]
    assert "DCU" in state.vendor_reasons["node-mixed"]
    nothing = _node("empty", {"hami.io/node-dcu-register": "no separator"}, {})
    why = state.upsert_node(nothing)
    assert "annos not found hami.io/node-nvidia-register" in why and "DCU" in why
    assert state.ledger.node("node-empty") is None


def test_only_the_vendors_said_healthy_register() -> None:
    state = ClusterState(make_config(registry=REGISTRY))
    assert state.upsert_node(MIXED_NODE, vendors={"DCU"}) == ""
    assert [d.vendor for d, *_ in state.ledger.device_usage("node-mixed")] == ["DCU"]


def test_a_malformed_vendor_pod_annotation_is_not_cached() -> None:
    state = ClusterState(make_config(registry=REGISTRY))
    state.upsert_node(MIXED_NODE)
    pod = _pod("x", {}, {"hami.io/vgpu-node": "node-mixed",
                         "hami.io/dcu-devices-allocated": "DCU-0,DCU,notanumber,0:;"})
    assert state.upsert_pod(pod) is False
    assert state.ledger.pod("uid-x") is None


def test_init_only_vendor_takes_no_lock_and_quota_shrinks_with_the_pod() -> None:
    state = ClusterState(make_config(registry=REGISTRY))
    state.upsert_node(MIXED_NODE)
    state.upsert_quota({"metadata": {"name": "q", "namespace": "ns"},
                        "spec": {"hard": {"limits.hygon.com/dcumem": "100000"}}})
    pod = _pod("mix", CASES["NVIDIA"][2], {})
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {
        "hygon.com/dcunum": 1, "hygon.com/dcumem": 5000}}}]
    decision = state.filter(pod, ["node-mixed"])
    assert decision.annotations["hami.io/dcu-devices-allocated"] == "DCU-0,DCU,5000,0:;;"
    assert decision.annotations["hami.io/vgpu-devices-allocated"] == ";GPU-0,NVIDIA,1000,0:;"
    state.commit(pod, decision)
    assert state.lock_vendors("uid-mix") == ("NVIDIA",)  # the DCU is an init container's
    assert state.vendor_quota is not None
    assert state.vendor_quota.used("ns", "hygon.com/dcumem") == 5000
    assert state.quota.quota("ns").memory_used_mib == 1000  # NVIDIA quota: GPUs only
    done = {**pod, "metadata": {**pod["metadata"], "annotations": decision.annotations},
            "status": {"initContainerStatuses": [{"state": {"terminated": {"exitCode": 0}}}]}}
    assert state.upsert_pod(done) is True
    assert state.vendor_quota.used("ns", "hygon.com/dcumem") == 0
    assert {d.uuid: used for d, used, _, _ in state.ledger.device_usage("node-mixed")} == {
        "GPU-0": 1, "DCU-0": 0}
    state.remove_pod("uid-mix")
    assert state.quota.quota("ns").memory_used_mib == 0
    assert state.vendor_quota.used("ns", "hygon.com/dcumem") == 0


@pytest.mark.parametrize(("policy", "order", "node", "score"), [
    ("binpack", ["node-b", "node-a"], "node-a", 1.0),  # fills the pair next to the used XPU
    ("spread", ["node-a", "node-b"], "node-b", -2.0),  # opens a fresh node
])
def test_kunlun_score_node_decides_between_equal_nodes(policy: str, order: list[str],
                                                      node: str, score: float) -> None:
    """kunlun's ScoreNode (MTF decrease) is added to the node score, so every candidate
    is fitted: the default scores are equal here (0: the XPUs have no memory figure) and
    the first node in policy order would otherwise win."""
    state = ClusterState(make_config(registry=REGISTRY))
    for name in ("a", "b"):
        state.upsert_node(_node(name, {}, {"kunlunxin.com/xpu": 8}))
    busy = _pod("busy", {"kunlunxin.com/xpu": 1}, {})
    state.commit(busy, state.filter(busy, ["node-a"]))
    nxt = _pod("next", {"kunlunxin.com/xpu": 1}, {"hami.io/node-scheduler-policy": policy})
    decision = state.filter(nxt, order)
    assert (decision.result.node, decision.result.score) == (node, score)
    assert decision.annotations["hami.io/vgpu-node"] == node


def test_a_device_reported_twice_registers_once() -> None:
    """Two copies of one card would split its usage: the second looks free while the
    first is full. Enflame's GCU and vGCU backends both synthesise ``<node>-enflame-<i>``
    from capacity; an annotation may also repeat a UUID. The first entry wins, the rest is
    reported, and the card is never sold twice (found by a breaker)."""
    from hami.devices.registry import build_registry

    state = ClusterState(make_config(registry=build_registry({"nvidia": {}, "enflame": {}})))
    node = {"kind": "Node", "metadata": {"name": "n", "annotations": {}},
            "status": {"capacity": {"enflame.com/gcu": 1, "enflame.com/vgcu-percentage": 100}}}
    assert state.upsert_node(node) == ""
    assert [d.uuid for d, *_ in state.ledger.device_usage("n")] == ["n-enflame-0"]
    assert "n-enflame-0 is already registered" in state.vendor_reasons["n"]["GCU"]

    def share(uid: str) -> dict[str, Any]:
        return {"metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": {}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {
                    "enflame.com/vgcu": 1, "enflame.com/vgcu-percentage": 100}}}]}}
    first = share("b")
    state.commit(first, state.filter(first, ["n"]))
    assert state.filter(share("c"), ["n"]).result.node is None

    nvidia = ClusterState(make_config())
    twice = ('[{"id":"X-0","index":0,"count":1,"devmem":1000,"devcore":100,"type":"NVIDIA-T4",'
             '"numa":0,"mode":"hami-core","health":true},{"id":"X-0","index":1,"count":1,'
             '"devmem":1000,"devcore":100,"type":"NVIDIA-T4","numa":0,"mode":"hami-core",'
             '"health":true}]')
    assert nvidia.upsert_node({"metadata": {"name": "n", "annotations": {
        "hami.io/node-nvidia-register": twice}}}) == ""
    assert len(nvidia.ledger.device_usage("n")) == 1
    assert "NVIDIA" in nvidia.vendor_reasons["n"]
