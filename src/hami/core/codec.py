"""HAMi v2.10 annotation values <-> model values, byte-compatible with HAMi.

Pure: no I/O, no clock, no logging. Every decoder raises only :class:`CodecError` (a
``ValueError``) on malformed input, whatever the input; encoders raise it for values the
wire format cannot carry (a separator inside a field, an integer outside its Go type).

Sources (HAMi v2.10): handshake and node score, node
register (JSON and legacy), pod device string, node lock, scoring weights,
MIG allocations. Go's ``strconv``/``encoding/json`` rules live in :mod:`.gowire`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, cast

from hami.api.names import MODE_HAMI_CORE, NVIDIA
from hami.core.codec_mig import (
    PLACEMENT_SHAPE,
    MigAllocation,
    MigRuntimeIdentity,
    decode_mig_allocations,
    encode_mig_allocations,
    placement_json,
)
from hami.core.codec_scores import ScoringWeights, decode_node_scores, parse_scoring_weights
from hami.core.codec_time import (
    Handshake,
    NodeLock,
    decode_handshake,
    decode_node_lock,
    encode_handshake,
    encode_node_lock,
    is_handshake_requesting,
)
from hami.core.gowire import (
    INT32,
    INT64,
    UINT32,
    UINT64,
    CodecError,
    as_bool,
    as_int,
    as_list,
    as_object,
    as_string,
    as_struct,
    check_range,
    check_text,
    decode_entry,
    go_json_string,
    go_quote,
    load_go_json,
    parse_go_bool,
    parse_go_int,
    top_list,
)
from hami.core.model import ContainerDevice, DeviceInfo, MigPlacement, MigProfile, PodSingleDevice

__all__ = [
    "CodecError",
    "Handshake",
    "MigAllocation",
    "MigRuntimeIdentity",
    "NodeLock",
    "ScoringWeights",
    "decode_handshake",
    "decode_mig_allocations",
    "decode_node_devices",
    "decode_node_devices_json",
    "decode_node_devices_legacy",
    "decode_node_lock",
    "decode_node_scores",
    "decode_pod_devices",
    "encode_handshake",
    "encode_mig_allocations",
    "encode_node_devices",
    "encode_node_devices_legacy",
    "encode_node_lock",
    "encode_pod_devices",
    "is_handshake_requesting",
    "served_pod_devices",
    "parse_scoring_weights",
]


_JSON_SPACE: Final = " \t\n\r"
#: The legacy form reads ``index`` with ``strconv.Atoi`` and refuses negatives.
_LEGACY_INDEX: Final = ("int", 0, 2**63 - 1)


# --- node register annotation (HAMi v2.10) ----------------------------------------------------

_PROFILE: Final = {
    "name": as_string,
    "memoryMB": as_int(INT32),
    "core": as_int(INT32),
    "sliceCount": as_int(UINT32),
    "placements": as_list(
        as_struct(PLACEMENT_SHAPE, "MigPlacement"), "[]MigPlacement", null_element={}
    ),
}
_TEMPLATE: Final = {
    "Name": as_string,
    "Core": as_int(INT32),
    "Memory": as_int(INT32),
    "Count": as_int(INT32),
}
_DEVICE: Final = {
    "id": as_string,
    "index": as_int(UINT64),
    "count": as_int(INT32),
    "devmem": as_int(INT32),
    "devcore": as_int(INT32),
    "type": as_string,
    "numa": as_int(INT64),
    "mode": as_string,
    "migProfiles": as_list(as_struct(_PROFILE, "MigProfile"), "[]MigProfile", null_element={}),
    "migtemplate": as_list(
        as_list(as_struct(_TEMPLATE, "MigTemplate"), "Geometry", null_element={}),
        "[]Geometry",
        null_element=[],
    ),
    "health": as_bool,
    "devicevendor": as_string,
    "custominfo": as_object,
}


def decode_node_devices(value: str, vendor: str = NVIDIA) -> tuple[DeviceInfo, ...]:
    """Decode ``hami.io/node-nvidia-register`` in either form (HAMi v2.10).

    A value whose first non-blank character is ``[`` or ``{``, or that is ``null``, is
    read as JSON (:func:`decode_node_devices_json`); anything else as the legacy
    colon/comma form (:func:`decode_node_devices_legacy`). Every device gets ``vendor``.

    Raises :class:`CodecError`; an empty device list is ``no gpu found on node``.
    """
    stripped = value.strip(_JSON_SPACE)
    if stripped[:1] in ("[", "{") or stripped == "null":
        return decode_node_devices_json(value, vendor)
    return decode_node_devices_legacy(value, vendor)


def decode_node_devices_json(value: str, vendor: str = NVIDIA) -> tuple[DeviceInfo, ...]:
    """Decode the JSON node register array with Go ``encoding/json`` semantics (HAMi v2.10).

    Unknown keys are ignored, keys match case-insensitively, missing keys are zero values
    (a missing ``health`` is *unhealthy*, a missing ``mode`` is ``""``). ``count``,
    ``devmem``, ``devcore`` are int32, ``index`` uint, ``numa`` int; MIG ``sliceCount``,
    ``start``, ``size`` uint32. A ``null`` device entry is rejected (HAMi would crash).

    Raises :class:`CodecError` (bad JSON, wrong types, out-of-range ints, ``[]`` or
    ``null`` => ``no gpu found on node``).
    """
    items = top_list(
        load_go_json(value, "node register annotation"),
        "node register annotation",
        "[]*device.DeviceInfo",
    )
    devices = []
    for i, item in enumerate(items):
        if item is None:
            raise CodecError(f"node register annotation: device {i} is null")
        fields = decode_entry(item, _DEVICE, "DeviceInfo", f"node register annotation device {i}")
        devices.append(_device_from(fields, vendor))
    if not devices:
        raise CodecError("no gpu found on node")
    return tuple(devices)


def _device_from(f: dict[str, object], vendor: str) -> DeviceInfo:
    return DeviceInfo(
        uuid=cast(str, f.get("id", "")),
        index=cast(int, f.get("index", 0)),
        split_count=cast(int, f.get("count", 0)),
        memory_mib=cast(int, f.get("devmem", 0)),
        cores_percent=cast(int, f.get("devcore", 0)),
        type=cast(str, f.get("type", "")),
        numa=cast(int, f.get("numa", 0)),
        mode=cast(str, f.get("mode", "")),
        health=cast(bool, f.get("health", False)),
        mig_profiles=tuple(
            _profile_from(cast(dict[str, object], p))
            for p in cast(list[object], f.get("migProfiles", []))
        ),
        vendor=vendor,
    )


def _profile_from(f: dict[str, object]) -> MigProfile:
    placements = cast(list[dict[str, int]], f.get("placements", []))
    return MigProfile(
        name=cast(str, f.get("name", "")),
        memory_mib=cast(int, f.get("memoryMB", 0)),
        cores_percent=cast(int, f.get("core", 0)),
        slice_count=cast(int, f.get("sliceCount", 0)),
        placements=tuple(MigPlacement(p.get("start", 0), p.get("size", 0)) for p in placements),
    )


def encode_node_devices(devices: Iterable[DeviceInfo]) -> str:
    """HAMi's JSON node register value, byte-identical to Go's ``json.Marshal`` (HAMi v2.10).

    Keys in order ``id, index, count, devmem, devcore, type, numa, mode, migProfiles,
    health``; each omitted when zero/empty/false; no spaces; ``vendor`` is not written.
    A MIG profile always has its five keys; empty ``placements`` are written ``null`` as
    Go does for a nil slice. No devices encode to ``[]``.

    Raises :class:`CodecError` when an integer does not fit its Go type.
    """
    return "[" + ",".join(_device_json(d) for d in devices) + "]"


def _device_json(d: DeviceInfo) -> str:
    parts = []
    if d.uuid:
        parts.append('"id":' + go_json_string(d.uuid))
    for key, number, kind in (
        ("index", d.index, UINT64),
        ("count", d.split_count, INT32),
        ("devmem", d.memory_mib, INT32),
        ("devcore", d.cores_percent, INT32),
    ):
        if check_range(number, kind, f"device {key}"):
            parts.append(f'"{key}":{number}')
    if d.type:
        parts.append('"type":' + go_json_string(d.type))
    if check_range(d.numa, INT64, "device numa"):
        parts.append(f'"numa":{d.numa}')
    if d.mode:
        parts.append('"mode":' + go_json_string(d.mode))
    if d.mig_profiles:
        parts.append('"migProfiles":[' + ",".join(_profile_json(p) for p in d.mig_profiles) + "]")
    if d.health:
        parts.append('"health":true')
    return "{" + ",".join(parts) + "}"


def _profile_json(p: MigProfile) -> str:
    placements = "null"
    if p.placements:
        placements = "[" + ",".join(placement_json(x) for x in p.placements) + "]"
    return (
        f'{{"name":{go_json_string(p.name)},"memoryMB":{check_range(p.memory_mib, INT32, "MIG profile memoryMB")},'
        f'"core":{check_range(p.cores_percent, INT32, "MIG profile core")},'
        f'"sliceCount":{check_range(p.slice_count, UINT32, "MIG profile sliceCount")},"placements":{placements}}}'
    )


def decode_node_devices_legacy(value: str, vendor: str = NVIDIA) -> tuple[DeviceInfo, ...]:
    """Decode the legacy ``id,count,devmem,devcore,type,numa,health[,index,mode]:`` form.

    Devices are separated by ``:`` (empty segments skipped); 7 fields mean index 0 and
    mode ``hami-core``. Errors (HAMi v2.10's texts): ``node annotation missing device
    separator``, ``malformed node annotation segment: "<seg>"``, ``unexpected field count N
    in node annotation``, ``invalid <count|memory|core|health|numa|index> field: <strconv
    error>``, ``index field must not be negative: N``, and ``no gpu found on node``.
    """
    if ":" not in value:
        raise CodecError("node annotation missing device separator")
    devices = tuple(_legacy_device(seg, vendor) for seg in value.split(":") if seg)
    if not devices:
        raise CodecError("no gpu found on node")
    return devices


def _legacy_device(segment: str, vendor: str) -> DeviceInfo:
    if "," not in segment:
        raise CodecError(f"malformed node annotation segment: {go_quote(segment)}")
    items = segment.split(",")
    if len(items) not in (7, 9):
        raise CodecError(f"unexpected field count {len(items)} in node annotation")
    count = _field(lambda: parse_go_int(items[1], INT32), "count")
    memory = _field(lambda: parse_go_int(items[2], INT32), "memory")
    cores = _field(lambda: parse_go_int(items[3], INT32), "core")
    health = _field(lambda: int(parse_go_bool(items[6])), "health")
    numa = _field(lambda: parse_go_int(items[5], INT64, "Atoi"), "numa")
    index, mode = 0, MODE_HAMI_CORE
    if len(items) == 9:
        index, mode = _field(lambda: parse_go_int(items[7], INT64, "Atoi"), "index"), items[8]
        if index < 0:
            raise CodecError(f"index field must not be negative: {index}")
    return DeviceInfo(
        items[0], index, count, memory, cores, items[4], numa, mode, bool(health), vendor=vendor
    )


def _field(parse: Callable[[], int], name: str) -> int:
    try:
        return parse()
    except CodecError as exc:
        raise CodecError(f"invalid {name} field: {exc}") from None


def encode_node_devices_legacy(devices: Iterable[DeviceInfo]) -> str:
    """The legacy 9-field form ``id,count,devmem,devcore,type,numa,health,index,mode:`` (HAMi
    v2.10).

    Every device is terminated by ``:``; no devices encode to ``""``. Raises
    :class:`CodecError` for a ``,`` or ``:`` inside a text field, MIG profiles (the form
    cannot carry them) or integers outside their Go types.
    """
    out = []
    for d in devices:
        if d.mig_profiles:
            raise CodecError(
                f"device {go_quote(d.uuid)}: the legacy form cannot carry MIG profiles"
            )
        fields = (
            check_text(d.uuid, ",:", "device id"),
            str(check_range(d.split_count, INT32, "device count")),
            str(check_range(d.memory_mib, INT32, "device devmem")),
            str(check_range(d.cores_percent, INT32, "device devcore")),
            check_text(d.type, ",:", "device type"),
            str(check_range(d.numa, INT64, "device numa")),
            "true" if d.health else "false",
            str(check_range(d.index, _LEGACY_INDEX, "device index")),
            check_text(d.mode, ",:", "device mode"),
        )
        out.append(",".join(fields) + ":")
    return "".join(out)


# --- pod device string (HAMi v2.10) -----------------------------------------------------------


def encode_pod_devices(pod: PodSingleDevice) -> str:
    """The pod device string: ``UUID,Type,Usedmem,Usedcores:`` per device, ``;`` per container.

    Containers in order (init containers first); a container with no device is just
    ``;``; an empty pod is ``""``. ``index`` is not encoded. Raises :class:`CodecError`
    for ``,`` ``:`` ``;`` inside a UUID or type, or memory/cores outside int32.
    """
    return "".join("".join(_device_entry(d) for d in container) + ";" for container in pod)


def _device_entry(d: ContainerDevice) -> str:
    uuid = check_text(d.uuid, ",:;", "device UUID")
    kind = check_text(d.type, ",:;", "device type")
    memory = check_range(d.used_memory_mib, INT32, "device memory")
    cores = check_range(d.used_cores_percent, INT32, "device cores")
    return f"{uuid},{kind},{memory},{cores}:"


def decode_pod_devices(value: str) -> PodSingleDevice:
    """Decode a pod device string (``hami.io/vgpu-devices-allocated``/``-to-allocate``, HAMi v2.10).

    Containers are split on ``;`` keeping empty entries, so ``;GPU-a,NVIDIA,1000,0:;;;;``
    is five containers with a device only in the second (field case B14). **Decision:**
    the empty piece after the final ``;`` is that terminator's, not a container, and is
    dropped (HAMi keeps it as an extra empty container); thus ``encode(decode(x)) == x``
    for every string HAMi writes, and ``""`` decodes to ``()``. A string without a final
    ``;`` is still accepted (its last piece is the last container).

    Within a container, pieces are split on ``:``; pieces without ``,`` are ignored;
    fields beyond the fourth are ignored; ``index`` decodes as 0. As in HAMi v2.10,
    negative memory/cores and empty UUIDs are accepted.

    Raises :class:`CodecError`: ``pod annotation format error, missing fields, do not use
    nodeName in task spec`` (fewer than 4 fields), ``invalid memory field: <strconv
    error>``, ``invalid core field: <strconv error>`` (not an int32).
    """
    pieces = value.split(";")
    if pieces[-1] == "":
        pieces.pop()
    return tuple(_decode_container(piece) for piece in pieces)


def served_pod_devices(allocated: str) -> str:
    """The ``-to-allocate`` string as HAMi's device plugin leaves it once every container
    is served: one empty entry per container of ``allocated`` (``"G,NVIDIA,100,0:;;"`` ->
    ``";;"``). Raises :class:`CodecError` as :func:`decode_pod_devices`."""
    return encode_pod_devices(tuple(() for _ in decode_pod_devices(allocated)))


def _decode_container(piece: str) -> tuple[ContainerDevice, ...]:
    devices = []
    for entry in piece.split(":"):
        if "," not in entry:
            continue
        fields = entry.split(",")
        if len(fields) < 4:
            raise CodecError(
                "pod annotation format error, missing fields, do not use nodeName in task spec"
            )
        memory = _pod_field(fields[2], "memory")
        cores = _pod_field(fields[3], "core")
        devices.append(ContainerDevice(fields[0], fields[1], memory, cores))
    return tuple(devices)


def _pod_field(text: str, name: str) -> int:
    return _field(lambda: parse_go_int(text, INT32), name)
