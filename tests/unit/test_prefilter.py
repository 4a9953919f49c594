"""The vectorised prefilter over every vendor's rows of the ledger (issue 16): a pod that
asks for another vendor too is pruned like an NVIDIA-only pod, and the one filter loop
decides exactly as the exact fit does."""

from __future__ import annotations

from hami.core.fit import PodOptions
from hami.core.ledger import UsageLedger
from hami.core.model import ContainerDevice, ContainerDeviceRequest, DeviceInfo, PodRequest
from hami.core.prefilter import node_mask
from hami.core.state import ClusterState
from hami.devices.registry import build_registry, make_config


def gpus(node: str, n: int) -> list[DeviceInfo]:
    return [DeviceInfo(f"{node}-gpu-{i}", i, 10, 16384, 100, "NVIDIA-T4") for i in range(n)]


def dcus(node: str, n: int) -> list[DeviceInfo]:
    return [DeviceInfo(f"{node}-dcu-{i}", i, 4, 65520, 100, "DCU-Z100", vendor="DCU")
            for i in range(n)]


def mixed_request(dcu_nums: int) -> PodRequest:
    return PodRequest("ns", "p", "u", (ContainerDeviceRequest(1, memory_mib=1000),),
                      vendors=({"DCU": ContainerDeviceRequest(dcu_nums, "DCU", 1000)},))


def test_ledger_counts_devices_per_vendor_and_node() -> None:
    led = UsageLedger(capacity=2)  # rows grow past the initial capacity
    led.add_node("a", gpus("a", 2) + dcus("a", 2))
    led.add_node("b", gpus("b", 1))
    led.add_node("c", dcus("c", 3))
    assert led.vendor_device_counts("DCU").tolist() == [2, 0, 3]
    assert led.vendor_device_counts("NVIDIA").tolist() == [2, 1, 0]
    assert led.vendor_device_counts("MLU").tolist() == [0, 0, 0]
    led.remove_node("c")
    assert led.vendor_device_counts("DCU").tolist() == [2, 0, 0]
    led.add_node("a", gpus("a", 2))  # re-registered without its DCUs
    assert led.vendor_device_counts("DCU").tolist() == [0, 0, 0]


def test_prefilter_drops_nodes_short_of_a_vendors_devices() -> None:
    led = UsageLedger()
    led.add_node("gpu-only", gpus("gpu-only", 2))
    led.add_node("one-dcu", gpus("one-dcu", 2) + dcus("one-dcu", 1))
    led.add_node("two-dcu", gpus("two-dcu", 2) + dcus("two-dcu", 2))
    pod = PodOptions()
    assert node_mask(led, mixed_request(1), pod).tolist() == [False, True, True]
    assert node_mask(led, mixed_request(2), pod).tolist() == [False, False, True]


def test_mixed_pod_same_node_and_reasons_with_the_prefilter() -> None:
    """Nodes the prefilter drops still get the exact fit's reason when nothing fits."""
    state = ClusterState(make_config(registry=build_registry({"nvidia": {}, "hygon": {}})))
    state.ledger.add_node("gpu-only", gpus("gpu-only", 2))
    state.ledger.add_node("mixed", gpus("mixed", 1) + dcus("mixed", 1))
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {
               "nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000,
               "hygon.com/dcunum": 1, "hygon.com/dcumem": 1000}}}]}}
    assert state.filter(pod, ["gpu-only", "mixed"]).result.node == "mixed"
    pod["spec"]["containers"][0]["resources"]["limits"]["hygon.com/dcunum"] = 2
    result = state.filter(pod, ["gpu-only", "mixed"]).result
    assert result.node is None
    assert result.failed_nodes == {"gpu-only": "NodeInsufficientDevice",
                                   "mixed": "NodeInsufficientDevice"}


def test_prefilter_drops_nodes_whose_share_vendor_devices_are_full() -> None:
    """A DCU request (the NVIDIA-like Fit) is checked against free slots, memory and
    cores of the node's DCUs, not just their number."""
    registry = build_registry({"nvidia": {}, "hygon": {}})
    led = UsageLedger()
    led.add_node("full", gpus("full", 2) + dcus("full", 1))
    led.add_node("free", gpus("free", 2) + dcus("free", 1))
    led.add_pod("big", "full", ((ContainerDevice("full-dcu-0", "DCU", 65000, 0),),))
    request = mixed_request(1)
    assert node_mask(led, request, PodOptions(), registry).tolist() == [False, True]
    assert node_mask(led, request, PodOptions()).tolist() == [True, True]  # count only
