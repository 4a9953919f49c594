"""Iluvatar (spec §2.1 ``hami.io/node-<CW>-register`` CSV, §9 vMem unit 256 MiB)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDevice, ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.shares import ShareVendor, iluvatar
from tests.devices.util import ctr, node, state

ILU = ShareVendor(iluvatar("MR-V100"))


def test_names() -> None:
    names = ILU.resource_names()
    assert (names.count, names.memory, names.cores, names.memory_unit_mib) == (
        "iluvatar.ai/MR-V100-vgpu", "iluvatar.ai/MR-V100.vMem", "iluvatar.ai/MR-V100.vCore", 256)


@pytest.mark.parametrize(("limits", "want"), [
    ({"iluvatar.ai/MR-V100-vgpu": 1, "iluvatar.ai/MR-V100.vMem": 64,
      "iluvatar.ai/MR-V100.vCore": 50}, ContainerDeviceRequest(1, "MR-V100", 16384, 101, 50)),
    ({"iluvatar.ai/MR-V100-vgpu": 1}, ContainerDeviceRequest(1, "MR-V100", 0, 100, 0)),
    ({"iluvatar.ai/BI-V150-vgpu": 1}, None),
])
def test_request_vmem_units(limits: dict[str, int], want: ContainerDeviceRequest | None) -> None:
    assert ILU.container_request(ctr(limits)) == want


def test_node_and_fit_and_annotations() -> None:
    value = "il-0,4,32768,100,MR-V100,0,true,0,hami-core:"
    devs = ILU.node_devices(node(annotations={"hami.io/node-MR-V100-register": value}))
    assert devs[0].vendor == "MR-V100" and devs[0].memory_mib == 32768
    out = ILU.fit(state(devs), ContainerDeviceRequest(1, "MR-V100", 16384, 101, 50), FitContext())
    assert out.ok and out.devices == (ContainerDevice("il-0", "MR-V100", 16384, 50),)
    anns = ILU.pod_annotations((out.devices,), PatchContext())
    assert anns["hami.io/MR-V100-devices-to-allocate"] == "il-0,MR-V100,16384,50:;"
