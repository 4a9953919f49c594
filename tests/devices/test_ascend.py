"""Ascend vNPU (spec §9: template rounding, whole cards, hami-core mode, super pod,
ModeNotFit, runtime annotation; templates from HAMi's documented examples)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.ascend import ASCEND_310P, ASCEND_910B3, Ascend, AscendConfig
from hami.devices.common import AdmissionError
from tests.devices.util import ctr, dev, pod, state

A = Ascend(ASCEND_310P)
R, M = "huawei.com/Ascend310P", "huawei.com/Ascend310P-memory"
CORE_MODE = {"huawei.com/vnpu-mode": "hami-core"}


@pytest.mark.parametrize(("memory", "template_mem", "cores"), [
    (1, 3072, 12), (3072, 3072, 12), (3073, 6144, 25), (6000, 6144, 25),
    (12288, 12288, 50),
])
def test_template_rounding_310p(memory: int, template_mem: int, cores: int) -> None:
    req = A.container_request(ctr({R: 1, M: memory}))
    assert req == ContainerDeviceRequest(1, "Ascend310P", template_mem, 101, cores)


@pytest.mark.parametrize(("limits", "reason"), [
    ({R: 1}, "no memory"), ({R: 1, M: 12289}, "above the largest template"),
    ({R: 2, M: 3072}, "multi-device"),
])
def test_whole_cards(limits: dict[str, int], reason: str) -> None:
    req = A.container_request(ctr(limits))
    assert req is not None and (req.memory_percent, req.cores_percent) == (100, 100), reason


def test_910b3_templates() -> None:
    b = Ascend(ASCEND_910B3)
    req = b.container_request(ctr({"huawei.com/Ascend910B3": 1,
                                   "huawei.com/Ascend910B3-memory": 20000}))
    assert req == ContainerDeviceRequest(1, "Ascend910B3", 32768, 101, 50)


def test_hami_core_mode_keeps_memory_and_cores() -> None:
    cfg = AscendConfig.from_mapping({"commonWord": "Ascend910B3", "resourceCoreName":
                                     "huawei.com/Ascend910B3-core", "aiCore": 20,
                                     "templates": [{"name": "vir05", "memory": 16384,
                                                    "aiCore": 5}]})
    b = Ascend(cfg)
    c = ctr({"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 1000,
             "huawei.com/Ascend910B3-core": 30})
    assert b.request_for_pod(c, CORE_MODE) == ContainerDeviceRequest(
        1, "Ascend910B3", 1000, 101, 30)
    assert b.request_for_pod(c, {}) == ContainerDeviceRequest(1, "Ascend910B3", 16384, 101, 25)
    p: dict[str, Any] = pod(c)
    with pytest.raises(AdmissionError, match="hami-core"):
        b.mutate_admission(c, p)
    assert b.mutate_admission(c, pod(c, annotations=CORE_MODE)) is True


@pytest.mark.parametrize(("count", "want"), [(1, 2), (2, 2), (4, 4), (8, 8)])
def test_super_pod_counts(count: int, want: int) -> None:
    cfg = AscendConfig("910C", "Ascend910C", "huawei.com/Ascend910C",
                       "huawei.com/Ascend910C-memory", super_pod=True)
    req = Ascend(cfg).container_request(ctr({"huawei.com/Ascend910C": count}))
    assert req is not None and req.nums == want


@pytest.mark.parametrize("count", [3, 5, 7])
def test_super_pod_odd_counts_refused(count: int) -> None:
    cfg = AscendConfig("910C", "Ascend910C", "huawei.com/Ascend910C",
                       "huawei.com/Ascend910C-memory", super_pod=True)
    with pytest.raises(AdmissionError, match="1 or even"):
        Ascend(cfg).container_request(ctr({"huawei.com/Ascend910C": count}))


DEVS = [dev("npu-0", "Ascend310P", memory=21527), dev("npu-1", "Ascend310P", memory=21527,
                                                      index=1)]


@pytest.mark.parametrize(("pod_anns", "node_anns", "ok"), [
    ({}, {}, True),
    (CORE_MODE, {"hami-vnpu-core": "true"}, True),
    (CORE_MODE, {}, False),
    ({}, {"hami-vnpu-core": "true"}, False),
])
def test_mode_not_fit(pod_anns: dict[str, str], node_anns: dict[str, str], ok: bool) -> None:
    out = A.fit(state(DEVS), ContainerDeviceRequest(1, "Ascend310P", 3072, 101, 12),
                FitContext(pod_annotations=pod_anns, node_annotations=node_anns))
    assert out.ok is ok
    if not ok:
        assert out.reason == "2/2 ModeNotFit"


def test_runtime_annotation() -> None:
    out = A.fit(state(DEVS), ContainerDeviceRequest(1, "Ascend310P", 6144, 101, 25), FitContext())
    anns = A.pod_annotations((out.devices,), PatchContext("n", 42))
    uuid = out.devices[0].uuid
    assert json.loads(anns["huawei.com/Ascend310P"]) == [{"UUID": uuid, "temp": "vir02"}]
    assert anns["predicate-time"] == "42"
    assert anns["hami.io/Ascend310P-devices-allocated"] == f"{uuid},Ascend310P,6144,25:;"


def test_template_shares_fill_a_card() -> None:
    used = {"npu-0": (3, 18432, 75), "npu-1": (0, 21527, 100)}
    out = A.fit(state(DEVS, used), ContainerDeviceRequest(1, "Ascend310P", 6144, 101, 25),
                FitContext())
    assert out.reason == "2/2 CardInsufficientMemory"


SUPER = Ascend(AscendConfig("910C", "Ascend910C", "huawei.com/Ascend910C",
                            "huawei.com/Ascend910C-memory", super_pod=True))


@pytest.mark.parametrize(("busy", "nums", "want"), [
    ((), 2, {0, 1}), ((0,), 2, {2, 3}), ((0, 3), 2, {4, 5}), ((0, 3), 4, {4, 5, 6, 7}),
    ((0, 3, 5), 4, None),
])
def test_super_pod_takes_whole_modules(busy: tuple[int, ...], nums: int,
                                       want: set[int] | None) -> None:
    devs = [dev(f"c{i}", "Ascend910C", index=i, memory=65536) for i in range(8)]
    used = {f"c{i}": (1, 100, 10) for i in busy}
    out = SUPER.fit(state(devs, used), ContainerDeviceRequest(nums, "Ascend910C", 0, 100, 100),
                    FitContext())
    if want is None:
        assert out.reason == "8/8 CardNotFoundCustomFilterRule"
    else:
        assert {d.index for d in out.devices} == want
