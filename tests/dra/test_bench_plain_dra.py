"""The plain-DRA baseline of bench/bench_dra.py asks what hami's DRA mode asks: the same
cards (capacity) in its slices, the same memory and cores in its claims, but none of
hami's objects (its own driver and DeviceClass)."""

from __future__ import annotations

from bench.bench_dra import (
    CARD_MIB,
    GPUS,
    PLAIN_DRIVER,
    SPLIT,
    plain_device_class,
    plain_pod,
    plain_slice,
    plain_template,
    pod_limits,
)

from hami.core.model import DeviceInfo
from hami.core.quantity import parse_quantity
from hami.devices.nvidia import NvidiaConfig
from hami.dra.slices import DRIVER, resource_slice
from hami.dra.translate import translate


def _hami_pod(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d"},
            "spec": {"containers": [{"name": "c", "image": "pause",
                                     "resources": {"limits": pod_limits(i)}}]}}


def test_plain_slice_has_hamis_cards_without_hamis_driver() -> None:
    cards = [DeviceInfo(uuid=f"GPU-{g}", index=g, split_count=SPLIT, memory_mib=CARD_MIB,
                        cores_percent=100, type="NVIDIA-Tesla T4", numa=0, mode="hami-core",
                        health=True) for g in range(GPUS)]
    hami = resource_slice("n1", cards)["spec"]
    plain = plain_slice("n1")["spec"]
    assert plain["driver"] == PLAIN_DRIVER != DRIVER
    assert plain["nodeName"] == hami["nodeName"] == "n1"
    assert len(plain["devices"]) == len(hami["devices"]) == GPUS
    for p, h in zip(plain["devices"], hami["devices"], strict=True):
        assert p["allowMultipleAllocations"] is h["allowMultipleAllocations"] is True
        assert {k: v["value"] for k, v in p["capacity"].items()} == \
            {k: v["value"] for k, v in h["capacity"].items()}
        assert "attributes" not in p and "requestPolicy" not in str(p)


def test_plain_claims_ask_what_hamis_claims_ask() -> None:
    cls = plain_device_class()
    assert cls["metadata"]["name"] == PLAIN_DRIVER
    assert PLAIN_DRIVER in cls["spec"]["selectors"][0]["cel"]["expression"]
    names = set()
    for i in range(42):  # the mix repeats every 21 pods
        result = translate(_hami_pod(i), NvidiaConfig())
        assert result is not None
        (hami_tmpl,) = result.templates.values()
        (hreq,) = hami_tmpl["spec"]["spec"]["devices"]["requests"]
        tmpl = plain_template(pod_limits(i))
        (preq,) = tmpl["spec"]["spec"]["devices"]["requests"]
        assert preq["exactly"]["deviceClassName"] == PLAIN_DRIVER
        assert preq["exactly"]["count"] == hreq["exactly"]["count"] == 1
        asked = {k: parse_quantity(v) for k, v in preq["exactly"]["capacity"]["requests"].items()}
        hami_asked = {k: parse_quantity(v)
                      for k, v in hreq["exactly"]["capacity"]["requests"].items()}
        assert asked == {**hami_asked, "shares": 1}  # hami's policy defaults shares to 1
        names.add(tmpl["metadata"]["name"])
        pod = plain_pod(i, tmpl["metadata"]["name"])
        assert pod["spec"]["resourceClaims"] == [
            {"name": "gpu-0", "resourceClaimTemplateName": tmpl["metadata"]["name"]}]
        assert "limits" not in pod["spec"]["containers"][0]["resources"]
    assert len(names) == 21  # one template per distinct request, as hami's webhook makes
