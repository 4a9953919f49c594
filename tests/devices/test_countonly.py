"""Vastai and Biren (spec §9: count-only requests, 100 % memory and 0 cores, JSON
registers, filters under the vendor prefix)."""

from __future__ import annotations

import pytest

from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.countonly import COUNT_ONLY
from tests.devices.util import ctr, node, state

V, B = COUNT_ONLY["vastai"].vendor(), COUNT_ONLY["biren"].vendor()


@pytest.mark.parametrize(("vendor", "resource", "word", "register", "prefix"), [
    (V, "vastaitech.com/va", "Vastai", "hami.io/node-va-register", "vastaitech.com"),
    (B, "birentech.com/gpu", "Biren", "hami.io/node-biren-register", "birentech.com"),
])
def test_count_only(vendor: object, resource: str, word: str, register: str,
                    prefix: str) -> None:
    from hami.devices.countonly import CountOnlyVendor
    assert isinstance(vendor, CountOnlyVendor)
    assert vendor.container_request(ctr({resource: 2})) == ContainerDeviceRequest(
        2, word, 0, 100, 0)
    assert vendor.mutate_admission(ctr({resource: 1}), {}) is True
    value = ('[{"id":"x0","count":4,"devmem":32768,"devcore":100,"type":"T","health":true},'
             '{"id":"x1","index":1,"count":4,"devmem":32768,"devcore":100,"type":"T",'
             '"health":true}]')
    devs = vendor.node_devices(node(annotations={register: value}))
    assert [d.vendor for d in devs] == [word, word]
    req = ContainerDeviceRequest(1, word, 0, 100, 0)
    out = vendor.fit(state(devs, {"x0": (1, 100, 0)}), req, FitContext())
    assert [d.uuid for d in out.devices] == ["x1"]  # whole memory: x0 is busy
    out = vendor.fit(state(devs), req,
                     FitContext(pod_annotations={f"{prefix}/nouse-gpuuuid": "x0,x1"}))
    assert out.reason == "2/2 CardUuidMismatch"
    out = vendor.fit(state(devs), ContainerDeviceRequest(2, word, 0, 100, 0), FitContext())
    anns = vendor.pod_annotations((out.devices,), PatchContext())
    assert anns[f"hami.io/{word}-devices-to-allocate"] == f"x0,{word},32768,0:x1,{word},32768,0:;"
