"""Cambricon MLU (spec §2.1 own lock, §9 capacity devices, 256 MiB units, DSMLU profile)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.cambricon import Cambricon
from hami.devices.common import AdmissionError
from tests.devices.util import ctr, node, state

C = Cambricon()
N, M, K = "cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore"


@pytest.mark.parametrize(("limits", "want"), [
    ({N: 1, M: 20, K: 10}, ContainerDeviceRequest(1, "MLU", 20 * 256, 101, 10)),
    ({N: 1}, ContainerDeviceRequest(1, "MLU", 0, 100, 0)),
    ({N: 2, M: 20, K: 10}, ContainerDeviceRequest(2, "MLU", 0, 100, 100)),  # whole cards
    ({M: 20}, None),
])
def test_request(limits: dict[str, int], want: ContainerDeviceRequest | None) -> None:
    assert C.container_request(ctr(limits)) == want


def test_admission() -> None:
    assert C.mutate_admission(ctr({N: 1, K: 100}), {}) is True
    with pytest.raises(AdmissionError, match="must be 0..100"):
        C.mutate_admission(ctr({N: 1, K: 101}), {})


@pytest.mark.parametrize(("cap", "count", "memory"), [
    ({K: 400, M: 4 * 96}, 4, 96 * 256),
    ({K: 100, M: 64}, 1, 64 * 256),
    ({K: 99, M: 64}, 0, 0),
    ({}, 0, 0),
])
def test_devices_from_capacity(cap: dict[str, int], count: int, memory: int) -> None:
    devs = C.node_devices(node("mlu-node", capacity=cap))
    assert len(devs) == count
    if count:
        assert devs[-1].uuid == f"mlu-node-cambricon-mlu-{count - 1}"
        assert {d.memory_mib for d in devs} == {memory}
        assert {d.cores_percent for d in devs} == {100}


def test_lock_and_profile_annotations() -> None:
    assert C.lock_annotation == "cambricon.com/dsmlu.lock"
    devs = C.node_devices(node("n", capacity={K: 200, M: 128}))
    out = C.fit(state(devs), ContainerDeviceRequest(1, "MLU", 20 * 256, 101, 10), FitContext())
    assert out.ok
    anns = C.pod_annotations((out.devices,), PatchContext())
    d = out.devices[0]
    assert anns["CAMBRICON_DSMLU_PROFILE"] == f"{d.index}_10_20"
    assert anns["CAMBRICON_DSMLU_ASSIGNED"] == "false"
    assert anns["hami.io/cambricon-mlu-devices-allocated"] == f"{d.uuid},MLU,5120,10:;"


def test_fit_type_filter() -> None:
    devs = C.node_devices(node("n", capacity={K: 100, M: 64}))
    out = C.fit(state(devs), ContainerDeviceRequest(1, "MLU", 256, 101, 10),
                FitContext(pod_annotations={"cambricon.com/nouse-mlutype": "mlu"}))
    assert out.reason == "1/1 CardTypeMismatch"
