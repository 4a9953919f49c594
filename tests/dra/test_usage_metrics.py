"""DRA allocations in the shape of the scheduler's per-GPU and per-pod metrics."""

from __future__ import annotations

from typing import Any

from hami.core.model import DeviceInfo, MigPlacement, MigProfile
from hami.dra import migslices
from hami.dra.slices import DRIVER, MIB, resource_slice
from hami.dra.usage import CardUse, PodUse, metric_rows


def _cards(node: str) -> tuple[DeviceInfo, ...]:
    return tuple(DeviceInfo(uuid=f"GPU-{node}-{i}", index=i, split_count=4, memory_mib=1024,
                            cores_percent=100, type="NVIDIA-Tesla T4") for i in range(2))


def _claim(name: str, users: list[str], results: list[tuple[str, str, int, int]],
           ns: str = "ns") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name}, "status": {
        "reservedFor": [{"resource": "pods", "name": u, "uid": u} for u in users],
        "allocation": {"devices": {"results": [
            {"driver": DRIVER, "pool": pool, "device": dev, "request": "gpu",
             "consumedCapacity": {"memory": str(mem * MIB), "cores": str(cores), "shares": "1"}}
            for pool, dev, mem, cores in results]}}}}


def test_cards_and_pods_summed_from_claims() -> None:
    slices = [resource_slice("n1", _cards("n1"))]
    claims = [
        _claim("a", ["p1"], [("n1", "gpu-1", 300, 20)]),
        _claim("b", ["p1"], [("n1", "gpu-1", 100, 5)]),        # p1's second claim, same card
        _claim("shared", ["p2", "p3"], [("n1", "gpu-1", 200, 0)]),
        _claim("waiting", [], [("n1", "gpu-0", 50, 0)]),       # allocated, no pod yet
        _claim("elsewhere", ["p9"], [("n9", "gpu-0", 50, 0)]),  # no slice publishes it
        {"metadata": "garbage"}, "not a claim",
    ]
    cards, pods = metric_rows(slices, claims)  # type: ignore[list-item]
    assert cards == [
        CardUse("n1", "GPU-n1-0", 0, "NVIDIA-Tesla T4", 1024, 100, 1, 50, 0),
        CardUse("n1", "GPU-n1-1", 1, "NVIDIA-Tesla T4", 1024, 100, 3, 600, 25)]
    assert pods == [PodUse("ns", "n1", "p1", "GPU-n1-1", 400, 25),
                    PodUse("ns", "n1", "p2", "GPU-n1-1", 200, 0),
                    PodUse("ns", "n1", "p3", "GPU-n1-1", 200, 0)]


def test_mig_instances_are_not_cards() -> None:
    a100 = DeviceInfo(uuid="GPU-m", index=0, split_count=7, memory_mib=40960,
                      cores_percent=100, type="NVIDIA-A100", mode="mig",
                      mig_profiles=(MigProfile("1g.5gb", 4864, 14, 1, (MigPlacement(0, 1),)),))
    doc = resource_slice("m", ())
    doc["spec"]["devices"] = migslices.instance_devices(a100)
    claim = _claim("i", ["p"], [("m", "gpu-0-1g-5gb-0", 4864, 0)])
    assert metric_rows([doc], [claim]) == ([], [])
