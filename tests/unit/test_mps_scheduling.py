"""Scheduler side of operating mode ``mps``: ``nvidia.com/vgpu-mode`` must *contain* the
device's mode (hami-scheduler-spec §2.2), through the core Fit and through ``hami
schedule``, fed with the register annotation the device plugin writes in mps mode."""

from __future__ import annotations

import json

import pytest

from hami.core.fit import DeviceState, NodeOptions, PodOptions, fit_shares
from hami.core.model import PERCENT_UNSET, ContainerDeviceRequest, DeviceInfo
from hami.deviceplugin.config import PluginConfig
from hami.deviceplugin.discovery import PhysicalGpu
from hami.deviceplugin.register import encode_register, node_devices
from hami.devices.nvidia import CARD_FILTERS
from hami.offline import schedule

MODES = {"GPU-mps": "mps", "GPU-core": "hami-core", "GPU-unset": ""}


def devices() -> list[DeviceState]:
    return [DeviceState(DeviceInfo(uuid, i, 10, 16000, 100, "NVIDIA-Tesla-T4", 0, mode, True),
                        0, 0, 0)
            for i, (uuid, mode) in enumerate(MODES.items())]


def fit(annotation: str | None, nums: int = 1) -> tuple[list[str], str]:
    ann = {} if annotation is None else {"nvidia.com/vgpu-mode": annotation}
    pod = PodOptions.from_annotations(ann, "spread", CARD_FILTERS)
    out = fit_shares(devices(), ContainerDeviceRequest(nums, "NVIDIA", 1000, PERCENT_UNSET, 0),
                     pod, NodeOptions())
    return [d.uuid for d in out.devices], out.reason


@pytest.mark.parametrize(("annotation", "nums", "chosen", "reason"), [
    (None, 3, ["GPU-mps", "GPU-core", "GPU-unset"], ""),          # no annotation: any mode
    ("mps", 1, ["GPU-mps"], ""),
    ("mps", 2, [], "1/3 AllocatedCardsInsufficientRequest, 2/3 CardTypeMismatch"),
    ("hami-core", 2, ["GPU-core", "GPU-unset"], ""),              # unset mode = hami-core
    ("hami-core", 3, [], "1/3 CardTypeMismatch, 2/3 AllocatedCardsInsufficientRequest"),
    ("hami-core,mps", 3, ["GPU-mps", "GPU-core", "GPU-unset"], ""),  # contains both
    ("mig", 1, [], "3/3 CardTypeMismatch"),
    ("MPS", 1, [], "3/3 CardTypeMismatch"),                       # contains is case-sensitive
])
def test_vgpu_mode_filter(annotation: str | None, nums: int, chosen: list[str],
                          reason: str) -> None:
    assert fit(annotation, nums) == (chosen, reason)


def plugin_register(mode: str, uuid: str) -> str:
    """The ``hami.io/node-nvidia-register`` value our plugin writes for one 16 GiB T4."""
    gpu = PhysicalGpu(uuid, 0, "Tesla T4", 16 * 2**30)
    return encode_register(node_devices([gpu], PluginConfig(operating_mode=mode)))


def node(name: str, register: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": register}}}


def pod(name: str, mode: str | None) -> dict[str, object]:
    ann = {} if mode is None else {"nvidia.com/vgpu-mode": mode}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "annotations": ann},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}}}]}}


def test_hami_schedule_honours_vgpu_mode_with_plugin_written_registers() -> None:
    mps_register = plugin_register("mps", "GPU-m")
    assert json.loads(mps_register)[0]["mode"] == "mps"
    report = schedule([node("mps-node", mps_register),
                       node("core-node", plugin_register("hami-core", "GPU-c")),
                       pod("wants-mps", "mps"), pod("wants-core", "hami-core"),
                       pod("wants-mig", "mig")])
    pods = {p["name"]: p for p in report["pods"]}
    assert pods["wants-mps"]["node"] == "mps-node"
    assert pods["wants-mps"]["annotations"]["hami.io/vgpu-devices-to-allocate"] == \
        "GPU-m,NVIDIA,1000,0:;"
    assert pods["wants-core"]["node"] == "core-node"
    assert pods["wants-mig"]["node"] is None
    assert pods["wants-mig"]["failed_nodes"] == {"mps-node": "1/1 CardTypeMismatch",
                                                 "core-node": "1/1 CardTypeMismatch"}
    # each pod alone with only the other kind of node: it stays Pending, and says why
    for register, wanted in ((plugin_register("hami-core", "GPU-c"), "mps"),
                             (mps_register, "hami-core")):
        alone = schedule([node("n", register), pod("p", wanted)])["pods"][0]
        assert (alone["node"], alone["failed_nodes"]) == (None, {"n": "1/1 CardTypeMismatch"})
