"""Which pods count (spec §4.3) and node registration (spec §4.13), on ClusterState."""

from __future__ import annotations

import json

from hami.api import names
from hami.core.state import ClusterState
from hami.devices.registry import make_config

REGISTER = json.dumps([{"id": "G0", "count": 4, "devmem": 10000, "devcore": 100,
                        "type": "NVIDIA-A10", "health": True}])


def node(name="n", register=REGISTER):
    ann = {} if register is None else {names.NODE_REGISTER: register}
    return {"kind": "Node", "metadata": {"name": name, "annotations": ann}}


def bound_pod(name="p", allocated="G0,NVIDIA,3000,30:;", phase="Running", **meta):
    ann = {names.VGPU_NODE: "n", names.DEVICES_ALLOCATED: allocated}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}",
                                        "annotations": ann, **meta},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c"}]},
            "status": {"phase": phase}}


def used(state):
    return [(s, m, c) for _, s, m, c in state.ledger.device_usage("n")]


def test_registered_node_and_reasons_for_bad_ones():
    state = ClusterState(make_config())
    assert state.upsert_node(node()) == ""
    assert state.upsert_node(node("x", register=None)) == \
        "annos not found hami.io/node-nvidia-register"
    assert "x" in state.upsert_node(node("x", register="[{]"))
    assert state.ledger.node_names() == ["n"]
    # a node that turns bad is dropped, and registered again when it recovers
    state.upsert_node(node(register="garbage"))
    assert state.ledger.node("n") is None
    assert state.upsert_node(node()) == ""


def test_membership_rules():
    state = ClusterState(make_config())
    state.upsert_node(node())
    assert state.upsert_pod(bound_pod("a"))
    assert used(state) == [(1, 3000, 30)]
    # no vgpu-node annotation: not ours
    foreign = bound_pod("b")
    del foreign["metadata"]["annotations"][names.VGPU_NODE]
    assert not state.upsert_pod(foreign)
    # undecodable allocation: not cached, nothing charged
    assert not state.upsert_pod(bound_pod("c", allocated="G0,NVIDIA,lots,0:;"))
    # Terminating pods keep their charge, and one seen first while Terminating (a cold
    # start) is charged too: it holds its devices until it is gone
    assert state.upsert_pod(bound_pod("a", deletionTimestamp="2026-01-01T00:00:00Z"))
    assert state.upsert_pod(bound_pod("d", deletionTimestamp="2026-01-01T00:00:00Z"))
    assert used(state) == [(2, 6000, 60)]
    # terminal phases release
    assert not state.upsert_pod(bound_pod("a", phase="Succeeded"))
    assert not state.upsert_pod(bound_pod("d", phase="Failed"))
    assert used(state) == [(0, 0, 0)]
    # re-adding the same pod twice charges once
    state.upsert_pod(bound_pod("e"))
    state.upsert_pod(bound_pod("e"))
    assert used(state) == [(1, 3000, 30)]
    state.remove_pod("u-e")
    assert used(state) == [(0, 0, 0)]


def test_terminating_pod_counts_the_same_after_a_cold_start():
    # A Running pod with a long grace period holds 20000 MiB of a 24576 MiB card: a
    # scheduler that starts while it is Terminating must see the card as the one that
    # watched it all along does, and refuse a 10000 MiB pod there.
    register = json.dumps([{"id": "GPU-0", "count": 10, "devmem": 24576, "devcore": 100,
                            "type": "NVIDIA-A10", "health": True}])
    pod = bound_pod("old", allocated="GPU-0,NVIDIA,20000,0:;")
    incremental, cold = ClusterState(make_config()), ClusterState(make_config())
    incremental.upsert_node(node(register=register))
    incremental.upsert_pod(pod)
    terminating = bound_pod("old", allocated="GPU-0,NVIDIA,20000,0:;",
                            deletionTimestamp="2026-01-01T00:00:00Z")
    incremental.upsert_pod(terminating)
    cold.upsert_node(node(register=register))
    cold.upsert_pod(terminating)
    assert used(cold) == used(incremental) == [(1, 20000, 0)]
    new = {"kind": "Pod", "metadata": {"name": "new", "namespace": "ns", "uid": "u-new"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {
               "nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}}}]}}
    decision = cold.filter(new, ["n"])
    assert decision.result.node is None
    assert "CardInsufficientMemory" in decision.result.failed_nodes["n"]


def test_pod_of_another_scheduler_never_reserves_devices():
    # Anyone who may create a pod could write hami's allocation annotation on a pod of
    # another scheduler and mark a node's cards as full; such a pod is never charged.
    state = ClusterState(make_config())
    state.upsert_node(node())
    forged = bound_pod("squatter", allocated="G0,NVIDIA,10000,100:;")
    forged["spec"]["schedulerName"] = "default-scheduler"
    assert not state.upsert_pod(forged)
    del forged["spec"]["schedulerName"]
    assert not state.upsert_pod(forged)
    assert used(state) == [(0, 0, 0)]
    assert state.quota.namespaces().get("ns") is None or \
        state.quota.namespaces()["ns"].memory_used_mib == 0


def test_init_container_usage_shrinks_once_they_finish():
    state = ClusterState(make_config())
    state.upsert_node(node())
    pod = bound_pod("i", allocated="G0,NVIDIA,8000,0:;G0,NVIDIA,2000,10:;")
    pod["spec"]["initContainers"] = [{"name": "init"}]
    state.upsert_pod(pod)
    assert used(state) == [(1, 8000, 10)]
    pod["status"]["initContainerStatuses"] = [{"state": {"terminated": {"exitCode": 1}}}]
    state.upsert_pod(pod)
    assert used(state) == [(1, 8000, 10)]  # a failed init container does not count as done
    pod["status"]["initContainerStatuses"] = [{"state": {"terminated": {"exitCode": 0}}}]
    state.upsert_pod(pod)
    assert used(state) == [(1, 2000, 10)]
    state.upsert_pod(pod)  # a later update keeps the shrunk value
    assert used(state) == [(1, 2000, 10)]


def test_pods_on_unknown_nodes_count_once_the_node_registers():
    state = ClusterState(make_config())
    state.upsert_pod(bound_pod("early"))
    state.upsert_node(node())
    assert used(state) == [(1, 3000, 30)]


def test_a_refused_refilter_keeps_the_earlier_charge():
    import pytest

    from hami.core.filter import FilterError

    state = ClusterState(make_config())
    state.upsert_node(node())
    pod = bound_pod("w")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1,
                                                            "nvidia.com/gpumem": 3000}}
    state.upsert_pod(pod)
    pod["metadata"]["annotations"][names.DEVICE_SCORING_WEIGHTS] = "slot=x"
    with pytest.raises(FilterError):
        state.filter(pod)
    assert used(state) == [(1, 3000, 30)]


def test_nvidia_is_scheduled_only_when_registered():
    """The core has no NVIDIA path of its own: NVIDIA's requests and webhook mutation are
    the registry's backend's, so a config whose registry lacks NVIDIA places no GPU pod."""
    from hami.core.admission import admit
    from hami.core.config import SchedulerConfig

    node = {"metadata": {"name": "n1", "annotations": {
        "hami.io/node-nvidia-register": "GPU-0,10,32768,100,NVIDIA-V100,0,true:"}}}
    gpu_pod = {"metadata": {"name": "p", "namespace": "d", "uid": "u1"},
               "spec": {"containers": [{"name": "c", "resources": {
                   "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}}}]}}
    bare = ClusterState(SchedulerConfig(registry={}))
    bare.upsert_node(node)
    assert bare.filter(gpu_pod).result.passthrough
    assert admit(gpu_pod, bare.config).pod["spec"].get("schedulerName") is None
    state = ClusterState(make_config())
    state.upsert_node(node)
    assert state.filter(gpu_pod).result.node == "n1"


def test_nvidia_annotations_are_read_and_written_by_the_backend() -> None:
    # The core reads NVIDIA's register annotation and writes its pod annotations only
    # through the registry's NVIDIA backend (Vendor.node_devices / pod_annotations /
    # decode_allocation), as it does every other vendor's.
    from dataclasses import replace

    from hami.devices.nvidia import Nvidia
    from hami.devices.registry import Registry

    class Halved(Nvidia):
        def node_devices(self, node):
            return tuple(replace(d, memory_mib=d.memory_mib // 2)
                         for d in super().node_devices(node))

        def pod_annotations(self, grant, ctx):
            return {**super().pod_annotations(grant, ctx), "example.com/seen": "1"}

    config = replace(make_config(), registry=Registry({"NVIDIA": Halved()}))
    state = ClusterState(config)
    assert state.upsert_node({"metadata": {"name": "n1", "annotations": {
        "hami.io/node-nvidia-register": "GPU-0,10,32768,100,NVIDIA-V100,0,true:"}}}) == ""

    def gpu_pod(uid: str, mem: int) -> dict:
        return {"metadata": {"name": uid, "namespace": "d", "uid": uid},
                "spec": {"schedulerName": "hami-scheduler", "containers": [
                    {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1,
                                                           "nvidia.com/gpumem": mem}}}]}}

    assert state.filter(gpu_pod("big", 20000)).result.node is None  # 16384 MiB registered
    decision = state.filter(gpu_pod("small", 1000))
    assert decision.result.node == "n1"
    assert decision.annotations["example.com/seen"] == "1"
    assert decision.annotations["hami.io/vgpu-devices-allocated"] == "GPU-0,NVIDIA,1000,0:;"
