"""Placeholder until the codec branch lands."""
from __future__ import annotations
import json
from hami.core.model import PodSingleDevice, ContainerDevice

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
