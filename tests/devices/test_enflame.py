"""Enflame (spec §9: whole GCUs from capacity; shared vGCU percentage of memory+cores,
``enflame.com/gcu-assigned``; §2.2 keys)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.common import AdmissionError
from hami.devices.enflame import EnflameShare
from hami.devices.shares import ENFLAME_GCU, WholeCardVendor
from tests.devices.util import ctr, node, state

E = EnflameShare()
G = WholeCardVendor(ENFLAME_GCU)


@pytest.mark.parametrize(("limits", "want"), [
    ({"enflame.com/vgcu": 1, "enflame.com/vgcu-percentage": 22},
     ContainerDeviceRequest(1, "Enflame", 0, 22, 22)),
    ({"enflame.com/vgcu": 1}, ContainerDeviceRequest(1, "Enflame", 0, 100, 100)),
])
def test_share_requests(limits: dict[str, int], want: ContainerDeviceRequest) -> None:
    assert E.container_request(ctr(limits)) == want


@pytest.mark.parametrize("limits", [{"enflame.com/vgcu": 2},
                                    {"enflame.com/vgcu": 1, "enflame.com/vgcu-percentage": 0},
                                    {"enflame.com/vgcu": 1, "enflame.com/vgcu-percentage": 101}])
def test_share_refused(limits: dict[str, int]) -> None:
    with pytest.raises(AdmissionError):
        E.mutate_admission(ctr(limits), {})


def test_shares_fill_a_card() -> None:
    devs = E.node_devices(node("e", capacity={"enflame.com/vgcu-percentage": 200}))
    assert [d.uuid for d in devs] == ["e-enflame-0", "e-enflame-1"]
    req = ContainerDeviceRequest(1, "Enflame", 0, 30, 30)
    used = {"e-enflame-0": (2, 0, 80), "e-enflame-1": (1, 0, 90)}
    out = E.fit(state(devs, used), req, FitContext())
    assert out.reason == "2/2 CardInsufficientCore"
    out = E.fit(state(devs, {"e-enflame-0": (1, 0, 70)}), req, FitContext())
    assert out.ok
    anns = E.pod_annotations((out.devices,), PatchContext())
    assert set(anns) == {"hami.io/enflame-vgpu-devices-allocated", "enflame.com/gcu-assigned"}


def test_whole_gcu() -> None:
    devs = G.node_devices(node("e", capacity={"enflame.com/gcu": 8}))
    assert len(devs) == 8
    out = G.fit(state(devs), ContainerDeviceRequest(8, "GCU", 0, 100, 100), FitContext())
    assert out.ok and len(out.devices) == 8
    anns = G.pod_annotations((out.devices,), PatchContext())
    assert set(anns) == {"hami.io/enflame-gcu-devices-allocated",
                         "hami.io/enflame-gcu-devices-to-allocate"}
