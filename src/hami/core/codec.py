"""Placeholder until the codec branch lands."""
from __future__ import annotations

import json

from hami.core.model import ContainerDevice, PodSingleDevice


class CodecError(ValueError):
    pass

def decode_node_score(value: str) -> dict[str, dict[str, int]]:
    try:
        data = json.loads(value)
        return {e["uuid"]: {k: int(v) for k, v in e["score"].items()} for e in data}
    except Exception as exc:
        raise CodecError(str(exc)) from None

def encode_pod_devices(devices: PodSingleDevice) -> str:
    return "".join("".join(f"{d.uuid},{d.type},{d.used_memory_mib},{d.used_cores_percent}:" for d in c) + ";" for c in devices)

from hami.core.model import DeviceInfo  # noqa: E402


def decode_node_devices(value: str) -> tuple[DeviceInfo, ...]:
    try:
        data = json.loads(value)
        return tuple(DeviceInfo(d["id"], d.get("index", 0), d["count"], d["devmem"], d["devcore"], d["type"], d.get("numa", 0), d.get("mode", ""), d.get("health", False)) for d in data)
    except Exception as exc:
        raise CodecError(str(exc)) from None


def decode_pod_devices(value: str) -> PodSingleDevice:
    out = []
    for ctr in value.split(";")[:-1] if value else []:
        devs = []
        for d in ctr.split(":"):
            if "," not in d:
                continue
            f = d.split(",")
            devs.append(ContainerDevice(f[0], f[1], int(f[2]), int(f[3])))
        out.append(tuple(devs))
    return tuple(out)
