"""MIG-mode cards as partitionable devices in DRA mode (KEP-4815). Pure.

A card in ``mig`` mode (the device config's ``operatingMode``) is published as the MIG
instances it may host, not as one shareable card: one device per allowed profile
(``migProfileAllowlist``, the same profiles the register annotation carries) and per
NVML placement, named ``gpu-<index>-<profile>-<start>`` (``1g.5gb`` at slice 6 of card 0:
``gpu-0-1g-5gb-6``). Each card gets a counter set ``gpu-<index>-slices`` with one counter
``memory-slice-<k>`` of value 1 per memory slice; an instance at ``[start, start + size)``
consumes 1 of every counter in its range, so kube-scheduler never allocates two
instances that overlap on a card (as the NVML placements themselves forbid).

Each instance device carries the card's attributes (``uuid`` of the card, ``type``,
``productName``, ``numa``, ``index``) plus ``profile`` (e.g. ``1g.5gb``),
``placementStart``, ``placementSize`` and ``coresPercent`` (the profile's share of the
card's compute, what the namespace quota books for it, as HAMi books a MIG instance),
and one capacity, ``memory`` (the profile's bytes). It has no ``cores`` or ``shares`` capacity, so a request for a share of a card
(which always asks for ``cores``) never matches an instance: instances are asked for by
profile, e.g. the selector ``"profile" in device.attributes["gpu.hami.io"] &&
device.attributes["gpu.hami.io"].profile == "1g.5gb"`` (the webhook's prioritized lists
for ``nvidia.com/gpumem`` do that, :mod:`hami.dra.translate`). An unhealthy or cordoned
card taints all its instances.
"""

from __future__ import annotations

import re
from typing import Any

from hami.core.model import DeviceInfo, MigPlacement, MigProfile

MIB = 2**20
#: Counter sets per ResourceSlice and devices per slice with counters (upstream limits).
MAX_COUNTER_SETS_PER_SLICE = 8


def counter_set_name(index: int) -> str:
    """The counter set of card ``index``: ``gpu-<index>-slices`` (a DNS label)."""
    return f"gpu-{index}-slices"


def counter_name(k: int) -> str:
    """The counter of memory slice ``k``: ``memory-slice-<k>``."""
    return f"memory-slice-{k}"


def instance_name(index: int, profile: str, start: int) -> str:
    """The device name of ``profile`` at slice ``start`` of card ``index`` (a DNS label:
    lower case, every run of other characters one ``-``)."""
    label = re.sub(r"[^a-z0-9]+", "-", profile.lower()).strip("-") or "mig"
    return f"gpu-{index}-{label}-{start}"


def _span(card: DeviceInfo) -> int:
    return max((p.start + p.size for prof in card.mig_profiles for p in prof.placements),
               default=0)


def counter_set(card: DeviceInfo) -> dict[str, Any]:
    """The ``spec.sharedCounters[]`` entry of one MIG card: one counter of value 1 per
    memory slice any of its placements covers."""
    return {"name": counter_set_name(card.index),
            "counters": {counter_name(k): {"value": "1"} for k in range(_span(card))}}


def instance_device(card: DeviceInfo, profile: MigProfile, place: MigPlacement,
                    taint: str | None = None) -> dict[str, Any]:
    """The ``spec.devices[]`` entry of ``profile`` at ``place`` on ``card`` (module
    docstring). ``taint``: ``unhealthy`` or ``cordoned`` taints it (NoSchedule)."""
    from hami.dra.slices import UNHEALTHY_TAINT, product_name

    device: dict[str, Any] = {
        "name": instance_name(card.index, profile.name, place.start),
        "attributes": {
            "uuid": {"string": card.uuid},
            "type": {"string": card.type},
            "productName": {"string": product_name(card.type)},
            "numa": {"int": card.numa},
            "index": {"int": card.index},
            "profile": {"string": profile.name},
            "placementStart": {"int": place.start},
            "placementSize": {"int": place.size},
            "coresPercent": {"int": max(profile.cores_percent, 0)},
        },
        "capacity": {"memory": {"value": str(max(profile.memory_mib, 0) * MIB)}},
        "consumesCounters": [{
            "counterSet": counter_set_name(card.index),
            "counters": {counter_name(k): {"value": "1"}
                         for k in range(place.start, place.start + place.size)}}],
    }
    if taint:
        device["taints"] = [{"key": UNHEALTHY_TAINT, "value": taint, "effect": "NoSchedule"}]
    return device


def instance_devices(card: DeviceInfo, cordoned: bool = False) -> list[dict[str, Any]]:
    """Every allowed instance of one MIG card, profiles in allowlist order, placements
    by start."""
    taint = "unhealthy" if not card.health else "cordoned" if cordoned else None
    return [instance_device(card, prof, place, taint) for prof in card.mig_profiles
            for place in sorted(prof.placements, key=lambda p: p.start)]
