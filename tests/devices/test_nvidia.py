"""The NVIDIA adapter gives the core's answers through the Protocol (spec §1.3, §3, §4.9)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.common import AdmissionError
from hami.devices.nvidia import Nvidia
from tests.devices.util import ctr, dev, node, state

N = Nvidia()


@pytest.mark.parametrize(("limits", "want"), [
    ({"nvidia.com/gpu": 1}, ContainerDeviceRequest(1, "NVIDIA", 0, 100, 0)),
    ({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4096},
     ContainerDeviceRequest(2, "NVIDIA", 4096, 101, 0)),
])
def test_requests(limits: dict[str, int], want: ContainerDeviceRequest) -> None:
    assert N.container_request(ctr(limits)) == want


def test_mutation_adds_exclusive_cores() -> None:
    c = ctr({"nvidia.com/gpu": 1})
    assert N.mutate_admission(c, {"spec": {}}) is True
    assert c["resources"]["limits"]["nvidia.com/gpucores"] == 100
    with pytest.raises(AdmissionError):
        N.mutate_admission(ctr({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 101}),
                           {"spec": {}})


def test_node_fit_annotations() -> None:
    value = '[{"id":"GPU-a","count":10,"devmem":16384,"devcore":100,"type":"NVIDIA-T4","health":true}]'
    devs = N.node_devices(node(annotations={"hami.io/node-nvidia-register": value}))
    out = N.fit(state(devs), ContainerDeviceRequest(1, "NVIDIA", 3000, 101, 0),
                FitContext(pod_annotations={"nvidia.com/use-gputype": "A100"}))
    assert out.reason == "1/1 CardTypeMismatch"
    out = N.fit(state(devs), ContainerDeviceRequest(1, "NVIDIA", 3000, 101, 0), FitContext())
    assert N.pod_annotations((out.devices,), PatchContext()) == {
        "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,3000,0:;",
        "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3000,0:;"}


def test_vendor_devices_are_not_nvidia() -> None:
    out = N.fit(state([dev("d0", "DCU", kind="DCU-Z100")]),
                ContainerDeviceRequest(1, "NVIDIA", 1000, 101, 0), FitContext())
    assert out.reason == "NodeInsufficientDevice"


def test_mig_instances_travel_through_the_protocol() -> None:
    """Issue 16: the MIG instances of a grant are the backend's to write
    (``PatchContext.mig``) and to read back (``decode_mig``); a vendor without MIG cards
    reads none."""
    from hami.api import names
    from hami.core.codec import MigAllocation
    from hami.core.model import ContainerDevice, MigPlacement
    from hami.devices.registry import build_registry

    grant = ((ContainerDevice("GPU-a", "NVIDIA", 4864, 0),),)
    mig = (MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1)),)
    out = N.pod_annotations(grant, PatchContext("n1", 0, {}, mig=mig))
    assert N.decode_mig(out) == mig
    assert names.MIG_ALLOCATIONS not in N.pod_annotations(grant, PatchContext("n1"))
    assert N.pod_annotations((), PatchContext("n1", mig=mig)) == {}
    assert N.decode_mig({}) == ()
    assert build_registry({"hygon": {}})["DCU"].decode_mig(out) == ()
