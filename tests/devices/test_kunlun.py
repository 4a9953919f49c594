"""Kunlunxin (spec §9: whole XPUs with topology groups and BAIDU_COM_DEVICE_IDX; vXPU
memory templates up to 98304; HAMi guides: sizes 1/2/4/8 within a NUMA half)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.common import AdmissionError
from hami.devices.kunlun import Kunlun, KunlunVxpu, mtf, topology_pick, xpu_template
from tests.devices.util import ctr, dev, node, state

K = Kunlun()
V = KunlunVxpu()


@pytest.mark.parametrize(("free", "nums", "want"), [
    (range(8), 8, (0, 1, 2, 3, 4, 5, 6, 7)),
    (range(1, 8), 8, None),
    (range(8), 4, (0, 1, 2, 3)),
    ([1, 2, 3, 4, 5, 6, 7], 4, (4, 5, 6, 7)),
    ([0, 1, 2, 4, 5, 6], 4, None),            # no full half
    ([0, 1, 2, 3, 5, 6, 7], 1, (5,)),         # the single next to a used card
    ([0, 1, 2, 3, 5, 6, 7], 2, (6, 7)),       # aligned pair in the fuller half
    ([0, 3, 4, 5, 6, 7], 2, (0, 3)),          # two lone cards: MTF 3 -> 1
    ([0, 4], 2, None),                        # never across halves
    ([1, 2, 5], 2, (1, 2)),
    ([1, 2, 3, 4, 5, 6, 7], 2, (2, 3)),       # MTF ties: the aligned pair
    (range(8), 1, (0,)),
    (range(8), 2, (0, 1)),
    (range(8), 3, None),
])
def test_topology_pick(free: range | list[int], nums: int, want: tuple[int, ...] | None) -> None:
    assert topology_pick(list(free), nums) == want


def _free(occupation: str) -> list[int]:
    """Card ``i`` is the ``i``-th character from the right; ``1`` = used."""
    return [i for i, c in enumerate(reversed(occupation)) if c == "0"]


@pytest.mark.parametrize(("occupation", "want"), [
    ("11111111", 0), ("00000000", 1), ("00000011", 2), ("00000001", 3), ("00010001", 4),
    ("11110000", 1), ("01010101", 4), ("11111110", 1),
])
def test_mtf_table_of_the_guide(occupation: str, want: int) -> None:
    assert mtf(_free(occupation)) == want


def test_score_node_prefers_less_fragmentation() -> None:
    devs = K.node_devices(node("k", capacity={"kunlunxin.com/xpu": 8}))
    from hami.core.model import ContainerDevice as CD
    fresh = state(devs)
    into_pair = ((CD("k-kunlun-0", "kunlun", 0, 100, 0),),)
    assert K.score_node(fresh, into_pair, FitContext()) == -2.0  # 1 -> 3
    used = state(devs, {"k-kunlun-0": (1, 0, 100)})
    fill = ((CD("k-kunlun-1", "kunlun", 0, 100, 1),),)
    assert K.score_node(used, fill, FitContext()) == 1.0  # fills a hole: 3 -> 2
    assert K.score_node(used, ((),), FitContext()) == 0.0


@pytest.mark.parametrize("nums", [3, 5, 6, 7, 9])
def test_whole_sizes_refused(nums: int) -> None:
    with pytest.raises(AdmissionError, match="1, 2, 4 or 8"):
        K.container_request(ctr({"kunlunxin.com/xpu": nums}))


def test_whole_fit_and_device_idx() -> None:
    devs = K.node_devices(node("k", capacity={"kunlunxin.com/xpu": 8}))
    assert [d.uuid for d in devs][:2] == ["k-kunlun-0", "k-kunlun-1"]
    used = {"k-kunlun-0": (1, 0, 100)}
    out = K.fit(state(devs, used), ContainerDeviceRequest(2, "kunlun", 0, 100, 100), FitContext())
    assert out.ok and [d.index for d in out.devices] == [2, 3]
    anns = K.pod_annotations((out.devices,), PatchContext())
    assert anns == {"hami.io/kunlun-allocated": "k-kunlun-2,kunlun,0,100:k-kunlun-3,kunlun,0,100:;",
                    "BAIDU_COM_DEVICE_IDX": "2,3"}


def test_whole_fit_reasons() -> None:
    devs = K.node_devices(node("k", capacity={"kunlunxin.com/xpu": 8}))
    used = {f"k-kunlun-{i}": (1, 0, 100) for i in (0, 4)}
    out = K.fit(state(devs, used), ContainerDeviceRequest(4, "kunlun", 0, 100, 100), FitContext())
    assert out.reason == "2/8 CardTimeSlicingExhausted, 6/8 CardNotFoundCustomFilterRule"
    out = K.fit(state(devs), ContainerDeviceRequest(8, "kunlun", 0, 100, 100),
                FitContext(node_annotations={"hami.io/device-cordon": "k-kunlun-7"}))
    assert out.reason == "1/8 CardCordoned, 7/8 AllocatedCardsInsufficientRequest"


@pytest.mark.parametrize(("memory", "want"), [
    (0, (98304, 100)), (1, (24576, 25)), (24576, (24576, 25)), (24577, (49152, 50)),
    (49152, (49152, 50)), (49153, (98304, 100)), (200000, (98304, 100)),
])
def test_vxpu_templates(memory: int, want: tuple[int, int]) -> None:
    assert xpu_template(memory) == want


def test_vxpu_request_and_fit() -> None:
    req = V.container_request(ctr({"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 20000}))
    assert req == ContainerDeviceRequest(1, "XPU", 24576, 101, 25)
    devs = [dev("x0", "XPU", memory=98304, split=4), dev("x1", "XPU", memory=98304, split=4)]
    out = V.fit(state(devs), req, FitContext(pod_annotations={"hami.io/no-use-xpu-uuid": "x0"}))
    assert out.ok and out.devices[0].uuid == "x1" and out.devices[0].type == "XPU"
    full = {"x0": (4, 98304, 100), "x1": (4, 98304, 100)}
    out = V.fit(state(devs, full), req, FitContext())
    assert out.reason == "2/2 CardTimeSlicingExhausted"
