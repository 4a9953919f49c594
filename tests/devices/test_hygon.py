"""Hygon DCU (spec §2.1 legacy register, §7.1 memoryFactor, §9 filters, NVIDIA-like Fit)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hami.core.gowire import CodecError
from hami.core.model import ContainerDeviceRequest
from hami.core.vendor import FitContext, PatchContext
from hami.devices.common import AdmissionError
from hami.devices.shares import HYGON, ShareVendor
from tests.devices.util import ctr, dev, node, state

H = ShareVendor(HYGON)


@pytest.mark.parametrize(("limits", "factor", "want"), [
    ({"hygon.com/dcunum": 1}, 1, ContainerDeviceRequest(1, "DCU", 0, 100, 0)),
    ({"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000, "hygon.com/dcucores": 60}, 1,
     ContainerDeviceRequest(1, "DCU", 2000, 101, 60)),
    ({"hygon.com/dcunum": 2, "hygon.com/dcumem": 1000}, 3,
     ContainerDeviceRequest(2, "DCU", 3000, 101, 0)),
    ({"hygon.com/dcumem": 1000}, 1, None),
])
def test_request(limits: dict[str, int], factor: int, want: ContainerDeviceRequest | None) -> None:
    assert ShareVendor(HYGON, replace(HYGON.defaults, memory_factor=factor)).container_request(ctr(limits)) == want


@pytest.mark.parametrize("limits", [
    {"hygon.com/dcunum": 1, "hygon.com/dcumem": "1.5"},
    {"hygon.com/dcunum": 1, "hygon.com/dcucores": 101},
    {"hygon.com/dcunum": "x"},
])
def test_admission_refuses(limits: dict[str, object]) -> None:
    with pytest.raises(AdmissionError):
        H.mutate_admission(ctr(limits), {})


def test_byte_quantity_gets_a_unit_hint() -> None:
    with pytest.raises(AdmissionError, match=r"'2Gi' is 2147483648 units; .*not bytes"):
        H.mutate_admission(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": "2Gi"}), {})
    with pytest.raises(AdmissionError) as plain:
        H.mutate_admission(ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": 3000000000}), {})
    assert "units" not in str(plain.value)


def test_admission_reports_resource() -> None:
    assert H.mutate_admission(ctr({"hygon.com/dcunum": 1}), {}) is True
    assert H.mutate_admission(ctr({"nvidia.com/gpu": 1}), {}) is False


def test_node_devices_legacy_form() -> None:
    value = "DCU-a,10,65520,100,DCU-Z100,0,true:DCU-b,10,65520,100,DCU-Z100,1,false,1,hami-core:"
    devs = H.node_devices(node(annotations={"hami.io/node-dcu-register": value}))
    assert [(d.uuid, d.index, d.numa, d.health, d.vendor) for d in devs] == [
        ("DCU-a", 0, 0, True, "DCU"), ("DCU-b", 1, 1, False, "DCU")]
    assert H.node_devices(node()) == ()
    with pytest.raises(CodecError, match="missing device separator"):
        H.node_devices(node(annotations={"hami.io/node-dcu-register": "garbage"}))


DEVS = [dev("d0", "DCU", kind="DCU-Z100", index=0), dev("d1", "DCU", kind="DCU-K100", index=1)]


@pytest.mark.parametrize(("anns", "ok", "uuids_or_reason"), [
    ({}, True, ["d0"]),
    ({"hygon.com/use-dcutype": "k100"}, True, ["d1"]),
    ({"hygon.com/nouse-dcutype": "Z100"}, True, ["d1"]),
    ({"hygon.com/use-gpuuuid": "d1"}, True, ["d1"]),
    ({"hygon.com/use-dcutype": "BW"}, False, "2/2 CardTypeMismatch"),
    ({"hygon.com/nouse-gpuuuid": "d0,d1"}, False, "2/2 CardUuidMismatch"),
    ({"nvidia.com/use-gputype": "BW"}, True, ["d0"]),  # NVIDIA keys do not apply
])
def test_fit_filters(anns: dict[str, str], ok: bool, uuids_or_reason: object) -> None:
    out = H.fit(state(DEVS), ContainerDeviceRequest(1, "DCU", 1000, 101, 10),
                FitContext(pod_annotations=anns))
    assert out.ok is ok
    if ok:
        assert [d.uuid for d in out.devices] == uuids_or_reason
        assert all(d.type == "DCU" for d in out.devices)
    else:
        assert out.reason == uuids_or_reason


def test_fit_reasons_follow_nvidia_order() -> None:
    devs = [dev("a", "DCU", memory=1000), dev("b", "DCU", health=False), dev("c", "DCU")]
    out = H.fit(state(devs, {"c": (0, 0, 90)}), ContainerDeviceRequest(1, "DCU", 2000, 101, 20),
                FitContext(node_annotations={}))
    assert out.reason == "1/3 CardInsufficientCore, 1/3 CardInsufficientMemory, 1/3 CardNotHealth"


def test_pod_annotations() -> None:
    from hami.core.model import ContainerDevice
    grant = ((), (ContainerDevice("d0", "DCU", 2000, 60),))
    value = ";d0,DCU,2000,60:;"
    assert H.pod_annotations(grant, PatchContext()) == {
        "hami.io/dcu-devices-allocated": value, "hami.io/dcu-devices-to-allocate": value}
    assert H.pod_annotations(((), ()), PatchContext()) == {}
    assert H.decode_allocation({"hami.io/dcu-devices-allocated": value}) == grant


@pytest.mark.parametrize(("value", "message"), [
    ("1.5", "hygon.com/dcumem of container c must be an integer, got '1.5'"),
    ("lots", "hygon.com/dcumem of container c: "),
    (-1, "hygon.com/dcumem of container c must be between 0 and 2147483647, got -1"),
    ("4Gi", "got 4294967296 ('4Gi' is 4294967296 units; device resources count plain "
            "numbers such as MiB, not bytes)"),
])
def test_malformed_integer_resources_are_refused_with_their_texts(value: object,
                                                                  message: str) -> None:
    """A share vendor's integer resources: not a number, not an integer, or out of int32
    range is an AdmissionError naming the resource and the container."""
    container = ctr({"hygon.com/dcunum": 1, "hygon.com/dcumem": value})
    with pytest.raises(AdmissionError) as caught:
        H.container_request(container)
    assert message in str(caught.value)
