"""Which devices a Node registers (HAMi v2.10 ``GetNodeDevices`` of every vendor, through
each backend's ``Vendor.node_devices``): NVIDIA's register annotation
(``hami.io/node-nvidia-register``) and every other registered vendor's register annotation
or node capacity, each UUID once. The share fast-path vendor's reasons (NVIDIA's) keep
HAMi's texts (``annos not found
<key>``, ``node <name>: <codec error>``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.codec import CodecError
from hami.core.model import DeviceInfo
from hami.core.podobjects import meta_of
from hami.core.vendor import Vendor


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """What :func:`read_node_devices` found on one Node."""

    name: str
    annotations: dict[str, str]
    devices: list[DeviceInfo]
    #: CommonWord -> why its devices could not be read (a missing NVIDIA annotation too).
    reasons: dict[str, str]
    #: What the shell reports: ``reasons`` without a missing NVIDIA annotation (normal on
    #: another vendor's node), plus a line per vendor whose repeated UUIDs were dropped.
    skipped: dict[str, str]


def read_node_devices(node: Mapping[str, Any], vendors: Mapping[str, Vendor],
                      wanted: Collection[str] | None = None,
                      fast: Vendor | None = None) -> NodeDevices:
    """The devices a Node (JSON mapping) reports: the share fast-path backend ``fast``'s
    (NVIDIA's: its register annotation; none without a backend), then each backend of
    ``vendors`` (CommonWord -> backend, the registry without ``fast``) in order.

    ``wanted`` limits which CommonWords are read (None: all). A vendor whose annotation
    is malformed is skipped with its reason and the others still register. A UUID
    reported twice (in one annotation, or by two vendors such as Enflame's GCU and vGCU
    over the same capacity) registers once, the first time.
    """
    meta = meta_of(node)
    name = str(meta.get("name") or "")
    annotations = dict(meta.get("annotations") or {})
    devices: list[DeviceInfo] = []
    reasons: dict[str, str] = {}
    register = (fast.register_key if fast is not None else None) or ""
    fast_word = fast.common_word if fast is not None else ""
    if fast is not None and (wanted is None or fast_word in wanted):
        if register not in annotations:
            reasons[fast_word] = f"annos not found {register}"
        else:
            try:
                devices.extend(fast.node_devices(node))
            except CodecError as exc:
                reasons[fast_word] = f"node {name}: {exc}"
    for word, vendor in vendors.items():
        if wanted is not None and word not in wanted:
            continue
        try:
            found = vendor.node_devices(node)
        except (CodecError, ValueError) as exc:
            reasons[word] = f"node {name}: {word}: {exc}"
            continue
        devices.extend(found)
    # a missing fast-path (NVIDIA) annotation is normal on another vendor's node; a
    # broken one is not
    skipped = {w: r for w, r in reasons.items()
               if w != fast_word or register in annotations}
    devices = _unique_devices(name, devices, skipped)
    return NodeDevices(name, annotations, devices, reasons, skipped)


def _unique_devices(node: str, devices: list[DeviceInfo],
                    skipped: dict[str, str]) -> list[DeviceInfo]:
    """``devices`` without repeated UUIDs (the first entry wins); each vendor whose entries
    were dropped gets a line in ``skipped`` (CommonWord -> reason)."""
    seen: dict[str, DeviceInfo] = {}
    for dev in devices:
        first = seen.setdefault(dev.uuid, dev)
        if first is not dev:
            why = (f"node {node}: {dev.vendor}: device {dev.uuid} is already registered"
                   f" (by {first.vendor}); the repeated entry is ignored")
            skipped[dev.vendor] = f"{skipped[dev.vendor]}; {why}" if dev.vendor in skipped else why
    return list(seen.values()) if len(seen) != len(devices) else devices


__all__ = ["NodeDevices", "read_node_devices"]
