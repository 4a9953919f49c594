"""``hami.io/vgpu-mig-allocations`` values and MIG placement JSON (HAMi v2.10).

Pure; part of :mod:`hami.core.codec`, which re-exports everything public here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, cast

from hami.core.gowire import (
    INT64,
    UINT32,
    CodecError,
    as_int,
    as_string,
    as_struct,
    check_range,
    decode_entry,
    go_json_string,
    load_go_json,
    top_list,
)
from hami.core.model import MigPlacement

__all__ = [
    "PLACEMENT_SHAPE",
    "MigAllocation",
    "MigRuntimeIdentity",
    "decode_mig_allocations",
    "encode_mig_allocations",
    "placement_json",
]

PLACEMENT_SHAPE: Final = {"start": as_int(UINT32), "size": as_int(UINT32)}


def placement_json(p: MigPlacement) -> str:
    """A MIG placement object ``{"start":S,"size":N}`` (uint32 each), as Go writes it."""
    return f'{{"start":{check_range(p.start, UINT32, "MIG placement start")},"size":{check_range(p.size, UINT32, "MIG placement size")}}}'


@dataclass(frozen=True, slots=True)
class MigRuntimeIdentity:
    """What the device plugin fills in once the MIG instance exists (ids may be 0)."""

    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """One MIG reservation of ``hami.io/vgpu-mig-allocations`` (HAMi v2.10).

    ``container_index``/``device_index`` are positions in the pod device list (init
    containers first); ``runtime`` is ``None`` until the device plugin realizes it.
    """

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    runtime: MigRuntimeIdentity | None = None


_MIG_ALLOCATION: Final = {
    "containerIndex": as_int(INT64),
    "deviceIndex": as_int(INT64),
    "gpuUUID": as_string,
    "profile": as_string,
    "placement": as_struct(PLACEMENT_SHAPE, "MigPlacement"),
    "migUUID": as_string,
    "gpuInstanceID": as_int(UINT32),
    "computeInstanceID": as_int(UINT32),
}


def _check_mig(i: int, a: MigAllocation, partial: bool, seen: set[tuple[int, int]]) -> None:
    """HAMi's per-entry checks, in its order: complete, whole runtime identity, unique."""
    if (
        a.container_index < 0
        or a.device_index < 0
        or not a.gpu_uuid
        or not a.profile
        or a.placement.size == 0
    ):
        raise CodecError(f"MIG allocation {i} is incomplete")
    if partial:
        raise CodecError(f"MIG allocation {i} has partial runtime identity")
    key = (a.container_index, a.device_index)
    if key in seen:
        raise CodecError(f"duplicate MIG allocation for container {key[0]} device {key[1]}")
    seen.add(key)


def decode_mig_allocations(value: str) -> tuple[MigAllocation, ...]:
    """Decode ``hami.io/vgpu-mig-allocations`` (HAMi v2.10); ``""`` and ``null`` are ``()``.

    Raises :class:`CodecError`: bad JSON/types (indices int, ``start``/``size`` and the
    instance ids uint32), ``MIG allocation N is incomplete`` (negative index, empty
    gpuUUID/profile, size 0), ``MIG allocation N has partial runtime identity`` (1 or 2
    of migUUID/gpuInstanceID/computeInstanceID), ``duplicate MIG allocation for
    container C device D``.
    """
    if value == "":
        return ()
    items = top_list(
        load_go_json(value, "MIG allocations annotation"),
        "MIG allocations annotation",
        "[]nvidia.MigAllocation",
    )
    out = []
    seen: set[tuple[int, int]] = set()
    for i, item in enumerate(items):
        f = (
            {}
            if item is None
            else decode_entry(item, _MIG_ALLOCATION, "MigAllocation", f"MIG allocation {i}")
        )
        mig_uuid = cast(str, f.get("migUUID", ""))
        gi, ci = (
            cast(int | None, f.get("gpuInstanceID")),
            cast(int | None, f.get("computeInstanceID")),
        )
        present = (mig_uuid != "") + (gi is not None) + (ci is not None)
        runtime = (
            MigRuntimeIdentity(mig_uuid, cast(int, gi), cast(int, ci)) if present == 3 else None
        )
        allocation = _mig_from(f, runtime)
        _check_mig(i, allocation, present not in (0, 3), seen)
        out.append(allocation)
    return tuple(out)


def _mig_from(f: dict[str, object], runtime: MigRuntimeIdentity | None) -> MigAllocation:
    place = cast(dict[str, int], f.get("placement", {}))
    return MigAllocation(
        container_index=cast(int, f.get("containerIndex", 0)),
        device_index=cast(int, f.get("deviceIndex", 0)),
        gpu_uuid=cast(str, f.get("gpuUUID", "")),
        profile=cast(str, f.get("profile", "")),
        placement=MigPlacement(place.get("start", 0), place.get("size", 0)),
        runtime=runtime,
    )


def encode_mig_allocations(allocations: Sequence[MigAllocation]) -> str:
    """The JSON HAMi writes; ``""`` (write no annotation) when there is none (HAMi v2.10).

    Keys ``containerIndex, deviceIndex, gpuUUID, profile, placement{start,size}`` then,
    when ``runtime`` is set, ``migUUID, gpuInstanceID, computeInstanceID``. Raises
    :class:`CodecError` for what :func:`decode_mig_allocations` would reject.
    """
    seen: set[tuple[int, int]] = set()
    for i, a in enumerate(allocations):
        _check_mig(i, a, a.runtime is not None and not a.runtime.mig_uuid, seen)
    return "[" + ",".join(_mig_json(a) for a in allocations) + "]" if allocations else ""


def _mig_json(a: MigAllocation) -> str:
    text = (
        f'{{"containerIndex":{check_range(a.container_index, INT64, "containerIndex")},'
        f'"deviceIndex":{check_range(a.device_index, INT64, "deviceIndex")},'
        f'"gpuUUID":{go_json_string(a.gpu_uuid)},"profile":{go_json_string(a.profile)},'
        f'"placement":{placement_json(a.placement)}'
    )
    if a.runtime is not None:
        text += (
            f',"migUUID":{go_json_string(a.runtime.mig_uuid)},'
            f'"gpuInstanceID":{check_range(a.runtime.gpu_instance_id, UINT32, "gpuInstanceID")},'
            f'"computeInstanceID":{check_range(a.runtime.compute_instance_id, UINT32, "computeInstanceID")}'
        )
    return text + "}"
