"""Moore Threads (spec §9: 512 MiB units, legal sizes, count>1 whole cards, annotations)."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.common import AdmissionError
from hami.devices.mthreads import LEGAL_MEMORY_UNITS, Mthreads
from tests.devices.util import ctr, node, pod, state

T = Mthreads()
G, M, K = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"


@pytest.mark.parametrize("units", LEGAL_MEMORY_UNITS)
def test_legal_sizes(units: int) -> None:
    req = T.container_request(ctr({G: 1, M: units, K: 8}))
    assert req == ContainerDeviceRequest(1, "Mthreads", units * 512, 101, 8)


@pytest.mark.parametrize("units", [1, 3, 5, 12, 48, 97, 128])
def test_illegal_sizes(units: int) -> None:
    with pytest.raises(AdmissionError, match="must be one of 2, 4, 8, 16, 32, 64, 96"):
        T.container_request(ctr({G: 1, M: units}))


@pytest.mark.parametrize(("limits", "want"), [
    ({G: 2, M: 4, K: 4}, ContainerDeviceRequest(2, "Mthreads", 0, 100, 16)),
    ({G: 1}, ContainerDeviceRequest(1, "Mthreads", 0, 100, 16)),
    ({G: 1, K: 4}, ContainerDeviceRequest(1, "Mthreads", 0, 100, 4)),
])
def test_whole_and_exclusive(limits: dict[str, int], want: ContainerDeviceRequest) -> None:
    assert T.container_request(ctr(limits)) == want


def test_webhook_writes_request_gpu_num() -> None:
    p: dict[str, Any] = pod(ctr({G: 2}))
    assert T.mutate_admission(p["spec"]["containers"][0], p) is True
    assert p["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "2"
    q: dict[str, Any] = pod(ctr({"nvidia.com/gpu": 1}))
    assert T.mutate_admission(q["spec"]["containers"][0], q) is False
    assert "mthreads.com/request-gpu-num" not in q["metadata"]["annotations"]


def test_scheduler_annotations() -> None:
    devs = T.node_devices(node("mt", capacity={K: 32, M: 2 * 96}))
    assert [d.uuid for d in devs] == ["mt-mthreads-0", "mt-mthreads-1"]
    assert devs[0].memory_mib == 96 * 512
    out = T.fit(state(devs), ContainerDeviceRequest(1, "Mthreads", 2048, 101, 8), FitContext())
    assert out.ok
    anns = T.pod_annotations((out.devices,), PatchContext("mt", 1700000000123456789))
    assert set(anns) == {"hami.io/mthreads-vgpu-devices-allocated", "mthreads.com/gpu-index",
                         "mthreads.com/predicate-time", "mthreads.com/predicate-node"}
    assert anns["mthreads.com/gpu-index"] == str(out.devices[0].index)
    assert anns["mthreads.com/predicate-time"] == "1700000000123456789"
    assert anns["mthreads.com/predicate-node"] == "mt"
