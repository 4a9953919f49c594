"""DRA mode, pure parts: the ResourceSlice of a node and the CDI spec of a claim."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.model import DeviceInfo
from hami.deviceplugin.allocate import NodeSettings
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import PhysicalGpu
from hami.deviceplugin.register import node_devices
from hami.dra import cdi, slices


def _gpus() -> list[PhysicalGpu]:
    return [PhysicalGpu("GPU-a", 0, "NVIDIA A100-SXM4-80GB", 81920 * 2**20, numa=0),
            PhysicalGpu("GPU-b", 1, "Tesla T4", 16384 * 2**20, numa=1, healthy=False)]


def test_slice_from_the_register_record_with_scaling() -> None:
    cfg = PluginConfig(device_memory_scaling=1.5, device_split_count=4)
    devs = node_devices(_gpus(), cfg)
    s = slices.resource_slice("node-1", devs, generation=3, owner={"name": "node-1", "uid": "u1"})
    spec = s["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        "gpu.hami.io", "node-1", {"name": "node-1", "generation": 3, "resourceSliceCount": 1})
    a, b = spec["devices"]
    assert a["name"] == "gpu-0" and a["allowMultipleAllocations"] is True
    assert a["capacity"]["memory"]["value"] == str(int(81920 * 1.5) * 2**20)
    assert a["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}}
    assert a["capacity"]["shares"]["value"] == "4"
    assert a["attributes"]["uuid"] == {"string": "GPU-a"}
    assert a["attributes"]["type"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert b["attributes"]["type"] == {"string": "NVIDIA-Tesla T4"}
    assert b["attributes"]["productName"] == {"string": "Tesla T4"}
    assert b["attributes"]["numa"] == {"int": 1} and b["attributes"]["index"] == {"int": 1}
    assert "taints" not in a
    assert b["taints"] == [{"key": "gpu.hami.io/unhealthy", "value": "unhealthy",
                            "effect": "NoSchedule"}]
    assert s["metadata"]["ownerReferences"][0]["uid"] == "u1"


def test_slice_changed_ignores_canonical_quantities_and_generation() -> None:
    devs = node_devices(_gpus(), PluginConfig())
    want = slices.resource_slice("n", devs, generation=2)
    stored = slices.resource_slice("n", devs, generation=1)
    stored["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["min"] = "1Mi"
    assert not slices.slice_changed(stored, want)
    healthy = node_devices(_gpus()[:1], PluginConfig())
    assert slices.slice_changed(stored, slices.resource_slice("n", healthy))


def test_too_many_cards_is_a_clear_error() -> None:
    many = [DeviceInfo(uuid=f"GPU-{i}", index=i, split_count=1, memory_mib=1, cores_percent=100,
                       type="NVIDIA-X", numa=0, mode="hami-core", health=True) for i in range(65)]
    with pytest.raises(slices.SliceError, match="at most 64"):
        slices.resource_slice("n", many)


def _claim(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"uid": "c-1", "namespace": "ns", "name": "cl"},
            "status": {"allocation": {"devices": {"results": results}}}}


def _result(device: str, mem: str, cores: str, pool: str = "node-1") -> dict[str, Any]:
    return {"request": "gpu", "driver": "gpu.hami.io", "pool": pool, "device": device,
            "shareID": f"share-{device}",
            "consumedCapacity": {"memory": mem, "cores": cores, "shares": "1"}}


def test_cdi_spec_carries_allocate_limits() -> None:
    claim = _claim([_result("gpu-0", "3Gi", "30"), _result("gpu-1", str(1024 * 2**20), "30")])
    cards = cdi.allocated_cards(claim, "node-1")
    assert [c.share_id for c in cards] == ["share-gpu-0", "share-gpu-1"]
    plan = cdi.claim_plan("c-1", "ns", "cl", cards, {"gpu-0": "GPU-a", "gpu-1": "GPU-b"},
                          PluginConfig(), NodeSettings(hook_path="/usr/local"), "cache-x")
    spec = cdi.cdi_spec("c-1", plan)
    assert spec["kind"] == "gpu.hami.io/claim" and spec["devices"][0]["name"] == "c-1"
    env = spec["devices"][0]["containerEdits"]["env"]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b" in env
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=3072m" in env and "CUDA_DEVICE_MEMORY_LIMIT_1=1024m" in env
    assert "CUDA_DEVICE_SM_LIMIT=30" in env
    assert "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/cache-x.cache" in env
    mounts = {m["containerPath"]: m for m in spec["devices"][0]["containerEdits"]["mounts"]}
    assert "ro" in mounts["/usr/local/vgpu/libvgpu.so"]["options"]
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    assert mounts["/usr/local/vgpu"]["hostPath"] == "/usr/local/vgpu/claims/c-1"
    assert "rw" in mounts["/usr/local/vgpu"]["options"]
    # the monitor removes containers/<uid>_* of UIDs that are no pod: claims live elsewhere
    paths = [m["hostPath"] for m in mounts.values()] + list(plan.host_dirs)
    assert not any("/vgpu/containers/" in p for p in paths), paths


@pytest.mark.parametrize("claim, message", [
    ({"status": {}}, "not allocated"),
    (_claim([_result("gpu-0", "1Gi", "0", pool="other")]), "not this node"),
    (_claim([{**_result("gpu-0", "1Gi", "0"), "consumedCapacity": None}]), "no consumedCapacity"),
    (_claim([_result("gpu-0", "1.5", "0")]), "not a whole number"),
    (_claim([{**_result("gpu-0", "1Gi", "0"), "driver": "x.example.com"}]), "holds no"),
    ("not a claim", "not allocated"),
])
def test_bad_claims_are_clear_errors(claim: object, message: str) -> None:
    with pytest.raises(cdi.ClaimError, match=message):
        cdi.allocated_cards(claim, "node-1")  # type: ignore[arg-type]


def test_foreign_device_and_bad_uid_refused() -> None:
    cards = cdi.allocated_cards(_claim([_result("gpu-7", "1Gi", "0")]), "node-1")
    with pytest.raises(cdi.ClaimError, match="not a GPU of this node"):
        cdi.claim_plan("c-1", "ns", "cl", cards, {"gpu-0": "GPU-a"}, PluginConfig(),
                       NodeSettings(), "x")
    with pytest.raises(cdi.ClaimError, match="malformed claim UID"):
        cdi.claim_plan("../../etc", "ns", "cl", cards, {"gpu-7": "GPU-a"}, PluginConfig(),
                       NodeSettings(), "x")
