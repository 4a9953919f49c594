"""Small builders for the vendor tests: containers, pods, nodes, device states."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.fit import DeviceState
from hami.core.model import DeviceInfo


def ctr(limits: Mapping[str, Any] | None = None, name: str = "c",
        requests: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A container with the given limits/requests."""
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = dict(limits)
    if requests is not None:
        res["requests"] = dict(requests)
    return {"name": name, "resources": res}


def pod(*containers: dict[str, Any], init: Iterable[dict[str, Any]] = (),
        annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod object."""
    return {"metadata": {"name": "p", "namespace": "default",
                         "annotations": dict(annotations or {})},
            "spec": {"initContainers": list(init), "containers": list(containers)}}


def node(name: str = "n1", annotations: Mapping[str, str] | None = None,
         capacity: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A node object."""
    return {"metadata": {"name": name, "annotations": dict(annotations or {})},
            "status": {"capacity": dict(capacity or {})}}


def state(devices: Iterable[DeviceInfo],
          used: Mapping[str, tuple[int, int, int]] | None = None) -> list[DeviceState]:
    """Device states; ``used[uuid] = (slots, memory, cores)``."""
    used = used or {}
    return [DeviceState(d, *used.get(d.uuid, (0, 0, 0))) for d in devices]


def dev(uuid: str, vendor: str, *, index: int = 0, split: int = 10, memory: int = 16384,
        cores: int = 100, kind: str | None = None, health: bool = True,
        numa: int = 0) -> DeviceInfo:
    """One device."""
    return DeviceInfo(uuid, index, split, memory, cores, kind or vendor, numa, "", health,
                      vendor=vendor)
