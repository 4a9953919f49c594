"""The core's share fast path belongs to the vendor whose ``Vendor.fast_path`` says so, not
to the CommonWord ``NVIDIA``: a backend that opts out is served through the per-vendor
entries with the same decision, and one under another key takes the fast path."""

from __future__ import annotations

import json

from hami.api import names
from hami.core.config import SchedulerConfig
from hami.core.request import pod_request
from hami.core.state import ClusterState
from hami.core.vendor import fast_path_vendor
from hami.devices.nvidia import Nvidia
from hami.devices.registry import Registry

REGISTER = json.dumps([{"id": f"G{i}", "count": 4, "devmem": 10000, "devcore": 100,
                        "type": "NVIDIA-A10", "health": True} for i in range(2)])


class PerVendorNvidia(Nvidia):
    """NVIDIA's backend, opting out of the fast path."""

    fast_path = False


class RenamedShare(Nvidia):
    """NVIDIA's rules under another registry key, on the fast path."""

    common_word = "XGPU"


def gpu_pod(name: str = "p") -> dict:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": limits}}]}}


def node(name: str) -> dict:
    return {"kind": "Node",
            "metadata": {"name": name, "annotations": {names.NODE_REGISTER: REGISTER}}}


def test_the_fast_path_vendor_is_chosen_by_the_protocol_not_the_name() -> None:
    slow, renamed = PerVendorNvidia(), RenamedShare()
    assert fast_path_vendor(Registry({"NVIDIA": slow})) is None
    assert fast_path_vendor(Registry({"NVIDIA": slow, "XGPU": renamed})) == ("XGPU", renamed)
    config = SchedulerConfig(registry=Registry({"NVIDIA": slow, "XGPU": renamed}))
    assert config.fast_vendor() is renamed
    assert list(config.vendors()) == ["NVIDIA"]


def test_a_renamed_share_backend_takes_the_fast_path() -> None:
    request = pod_request(gpu_pod(), Registry({"XGPU": RenamedShare()}))
    assert request.containers[0] is not None
    assert (request.containers[0].nums, request.containers[0].memory_mib) == (1, 3000)
    assert request.vendors == () or not any(request.vendors)


def test_an_opted_out_backend_goes_per_vendor_with_the_same_decision() -> None:
    request = pod_request(gpu_pod(), Registry({"NVIDIA": PerVendorNvidia()}))
    assert request.containers == (None,)
    assert set(request.vendors[0]) == {"NVIDIA"}
    decided = {}
    for backend in (Nvidia(), PerVendorNvidia()):
        state = ClusterState(SchedulerConfig(registry=Registry({"NVIDIA": backend})))
        for name in ("a", "b"):
            assert state.upsert_node(node(name)) == ""
        first = state.filter(gpu_pod("first"))
        state.commit(gpu_pod("first"), first)
        second = state.filter(gpu_pod("second"))
        decided[type(backend).__name__] = (first.result.node, first.annotations,
                                           second.result.node, second.annotations)
    assert decided["Nvidia"][0] is not None
    assert decided["Nvidia"] == decided["PerVendorNvidia"]
