"""AMD (spec §9: percentage -> CUs ``min(T, max(1, T x pct / 100))``, webhook range 1..100,
omitted => 100, whole-card memory by default, filters, allocation type = card model)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDevice, ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.amd import Amd, compute_units
from hami.devices.common import AdmissionError
from tests.devices.util import ctr, dev, node, state

A = Amd()
MI = "AMD_Instinct_MI300X_VF"


@pytest.mark.parametrize(("total", "pct", "cus"), [
    (304, 25, 76), (304, 100, 304), (304, 1, 3), (60, 1, 1), (10, 5, 1), (304, 33, 100),
    (120, 50, 60),
])
def test_percentage_to_cus(total: int, pct: int, cus: int) -> None:
    assert compute_units(total, pct) == cus


@pytest.mark.parametrize("pct", [0, 101, 200])
def test_webhook_rejects_out_of_range(pct: int) -> None:
    with pytest.raises(AdmissionError, match="1..100"):
        A.mutate_admission(ctr({"amd.com/gpu": 1, "amd.com/gpucores": pct}), {})


@pytest.mark.parametrize(("limits", "want"), [
    ({"amd.com/gpu": 1}, ContainerDeviceRequest(1, "AMD", 0, 100, 100)),
    ({"amd.com/gpu": 1, "amd.com/gpumem": 49152, "amd.com/gpucores": 25},
     ContainerDeviceRequest(1, "AMD", 49152, 101, 25)),
])
def test_requests(limits: dict[str, int], want: ContainerDeviceRequest) -> None:
    assert A.container_request(ctr(limits)) == want


REG = '[{"id":"amd-0","count":10,"devmem":196608,"devcore":304,"type":"' + MI + '","health":true}]'


def test_register_and_fit_in_cus() -> None:
    devs = A.node_devices(node(annotations={"hami.io/node-amd-register": REG}))
    assert devs[0].cores_percent == 304 and devs[0].vendor == "AMD"
    req = ContainerDeviceRequest(1, "AMD", 49152, 101, 25)
    out = A.fit(state(devs), req, FitContext())
    assert out.devices == (ContainerDevice("amd-0", MI, 49152, 76),)
    # four quarter shares fill the card's CUs exactly; a fifth does not fit
    out = A.fit(state(devs, {"amd-0": (4, 4 * 49152, 304)}), req, FitContext())
    assert out.reason == "1/1 CardInsufficientMemory"
    out = A.fit(state(devs, {"amd-0": (3, 0, 300)}), req, FitContext())
    assert out.reason == "1/1 CardInsufficientCore"
    whole = ContainerDeviceRequest(1, "AMD", 0, 100, 100)
    out = A.fit(state(devs), whole, FitContext())
    assert out.devices == (ContainerDevice("amd-0", MI, 196608, 304),)
    anns = A.pod_annotations((out.devices,), PatchContext())
    assert anns["hami.io/amd-devices-allocated"] == f"amd-0,{MI},196608,304:;"


@pytest.mark.parametrize(("anns", "reason"), [
    ({"amd.com/use-gputype": "MI250"}, "2/2 CardTypeMismatch"),
    ({"amd.com/nouse-gputype": "mi300x"}, "2/2 CardTypeMismatch"),
    ({"amd.com/use-gpu-uuid": "zzz"}, "2/2 CardUuidMismatch"),
    ({"amd.com/nouse-gpu-uuid": "a, b"}, "2/2 CardUuidMismatch"),
    ({"nvidia.com/use-gputype": "MI250"}, ""),
])
def test_filters(anns: dict[str, str], reason: str) -> None:
    devs = [dev("a", "AMD", kind=MI, cores=304), dev("b", "AMD", kind=MI, cores=304, index=1)]
    out = A.fit(state(devs), ContainerDeviceRequest(1, "AMD", 1024, 101, 10),
                FitContext(pod_annotations=anns))
    assert out.reason == reason and out.ok is (reason == "")
