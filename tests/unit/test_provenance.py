"""Allocation signatures (:mod:`hami.core.provenance`): what the device plugin accepts."""

from __future__ import annotations

import json

import pytest

from hami.api import names
from hami.core.provenance import SignatureError, key_id, sign, verify

CURRENT, PREVIOUS, FOREIGN = b"k" * 32, b"p" * 32, b"x" * 32
MIG = [{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-m", "profile": "1g.5gb",
        "placement": {"start": 6, "size": 1}}]


def written() -> dict[str, str]:
    grant = "GPU-0,NVIDIA,1000,30:;"
    return {names.VGPU_NODE: "n1", names.DEVICES_TO_ALLOCATE: grant,
            names.DEVICES_ALLOCATED: grant, names.VGPU_TIME: "1700000000",
            names.MIG_ALLOCATIONS: json.dumps(MIG)}


def signed(key: bytes = CURRENT, uid: str = "u1", node: str = "n1") -> dict[str, str]:
    ann = written()
    ann[names.ALLOCATION_SIGNATURE] = sign(key, uid, node, ann)
    return ann


def test_signature_survives_what_the_device_plugin_rewrites() -> None:
    ann = signed()
    assert ann[names.ALLOCATION_SIGNATURE].startswith(f"v1:{key_id(CURRENT)}:")
    ann[names.DEVICES_TO_ALLOCATE] = ";"  # entries consumed by Allocate
    ann[names.BIND_PHASE], ann[names.BIND_TIME] = "success", "1700000001"
    mig = [dict(MIG[0], migUUID="MIG-1", gpuInstanceID=9, computeInstanceID=0)]
    ann[names.MIG_ALLOCATIONS] = json.dumps(mig)  # runtime identity written back
    verify([CURRENT], "u1", "n1", ann)


@pytest.mark.parametrize(("change", "why"), [
    ({names.DEVICES_ALLOCATED: "GPU-0,NVIDIA,81920,100:;"}, "does not match"),
    ({names.VGPU_NODE: "n2"}, "does not match"),
    ({names.MIG_ALLOCATIONS: json.dumps([dict(MIG[0], profile="7g.40gb")])}, "does not match"),
    ({names.ALLOCATION_SIGNATURE: "v1:deadbeef:00"}, "not accepted"),
    ({names.ALLOCATION_SIGNATURE: "garbage"}, "malformed"),
    ({names.ALLOCATION_SIGNATURE: ""}, "not written by hami"),
])
def test_forged_or_changed_allocations_are_refused(change: dict[str, str], why: str) -> None:
    ann = {**signed(), **change}
    with pytest.raises(SignatureError, match=why):
        verify([CURRENT, PREVIOUS], "u1", "n1", ann)


def test_a_signature_is_bound_to_its_pod_node_and_key() -> None:
    ann = signed()
    for uid, node in (("u2", "n1"), ("u1", "n2")):  # copied onto another pod or node
        with pytest.raises(SignatureError, match="does not match"):
            verify([CURRENT], uid, node, ann)
    with pytest.raises(SignatureError, match="not accepted"):
        verify([CURRENT], "u1", "n1", signed(FOREIGN))
    verify([CURRENT, PREVIOUS], "u1", "n1", signed(PREVIOUS))  # during a rotation
    with pytest.raises(SignatureError, match="not accepted"):
        verify([CURRENT], "u1", "n1", signed(PREVIOUS))  # after it


def test_to_allocate_may_only_lag_the_signed_grant() -> None:
    from hami.core.provenance import check_to_allocate

    grant = "GPU-0,NVIDIA,1000,30:;GPU-1,NVIDIA,2000,0:;"
    check_to_allocate({names.DEVICES_ALLOCATED: grant, names.DEVICES_TO_ALLOCATE: grant})
    check_to_allocate({names.DEVICES_ALLOCATED: grant,
                       names.DEVICES_TO_ALLOCATE: ";GPU-1,NVIDIA,2000,0:;"})  # first served
    for forged in ("GPU-0,NVIDIA,81920,100:;GPU-1,NVIDIA,2000,0:;",
                   ";GPU-0,NVIDIA,1000,30:;", grant + "GPU-2,NVIDIA,1,0:;"):
        with pytest.raises(SignatureError):
            check_to_allocate({names.DEVICES_ALLOCATED: grant, names.DEVICES_TO_ALLOCATE: forged})
