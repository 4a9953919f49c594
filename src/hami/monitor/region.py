"""Reader of libvgpu's shared-region cache file (HAMi-core 1.2).

Pure parsing with :mod:`struct` from a bytes-like image of the file or through a
``read(offset, length)`` callable (the monitor passes ``os.pread``: it never maps a file a
container can truncate under it); nothing here opens files or takes the region's locks.

Two layouts are understood:

* **v1** (major 1, minors 0-2; HAMi-core 1.2): struct size 2,008,952 bytes, file size
  2,008,953. 16 devices, 1024 process slots of 1960 bytes.
* **v0** (legacy, no version fields; HAMi-core 1.2 "Version history"): struct size
  1,197,896 bytes, slots of 1168 bytes, no ``last_kernel_time``.

Version detection follows the HAMi monitor (HAMi-core 1.2): ``1,197,896 <= size <
2,008,952`` is v0; ``major == 1 and size >= 2,008,952`` is v1; anything else is
rejected. All integers are little-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC = 19920718
MAX_DEVICES = 16
MAX_PROCS = 1024
UUID_LEN = 96

V1_SIZE = 2_008_952
V0_SIZE = 1_197_896


class RegionError(ValueError):
    """The buffer is not a readable libvgpu shared region (truncated, corrupt or foreign)."""


@dataclass(frozen=True)
class _Layout:
    version: int
    off_device_num: int
    off_uuids: int
    off_limit: int
    off_sm_limit: int
    off_procs: int
    slot_size: int
    devmem_size: int
    off_slot_monitorused: int
    off_slot_util: int
    devutil_size: int
    off_slot_status: int
    off_proc_num: int
    off_last_kernel_time: int | None
    size: int


_V1 = _Layout(1, 56, 64, 1600, 1728, 1856, 1960, 64, 1032, 1160, 48, 1928, 2_008_896, 2_008_912, V1_SIZE)
_V0 = _Layout(0, 48, 56, 1592, 1720, 1848, 1168, 40, 648, 776, 24, 1160, 1_197_880, None, V0_SIZE)


@dataclass(frozen=True)
class DeviceUsage:
    """One process's usage of one device, in bytes (slot ``used[i]``, HAMi-core 1.2).

    ``context_bytes`` + ``module_bytes`` + ``data_bytes`` normally equal
    ``used_memory_bytes`` (the slot's ``total``).
    """

    context_bytes: int
    module_bytes: int
    data_bytes: int
    offset_bytes: int
    used_memory_bytes: int


@dataclass(frozen=True)
class ProcessSlot:
    """One process slot (HAMi-core 1.2 ``shrreg_proc_slot_t``).

    ``pid``: PID inside the container; ``host_pid``: PID on the host (0 when
    unknown); ``status``: 1 running, 2 suspended, 0 exited. ``devices`` has 16
    entries (device index = CUDA index); ``monitor_used_bytes`` is NVML's
    per-process figure; ``sm_util_percent`` per device.
    """

    index: int
    pid: int
    host_pid: int
    status: int
    devices: tuple[DeviceUsage, ...]
    monitor_used_bytes: tuple[int, ...]
    sm_util_percent: tuple[int, ...]


@dataclass(frozen=True)
class Region:
    """A parsed shared region.

    ``version`` is ``(major, minor)`` (``(0, 0)`` for legacy files);
    ``limit_bytes`` / ``sm_limit_percent`` have 16 entries (0 bytes = no
    limit); ``uuids`` has ``device_count`` entries (NUL padding stripped);
    ``procs`` holds the slots ``0 .. proc_num-1`` (including exited ones, see
    :meth:`active_procs`). ``last_kernel_time`` is unix seconds (0 for v0).
    """

    version: tuple[int, int]
    device_count: int
    uuids: tuple[str, ...]
    limit_bytes: tuple[int, ...]
    sm_limit_percent: tuple[int, ...]
    proc_num: int
    procs: tuple[ProcessSlot, ...]
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int
    owner_pid: int

    def active_procs(self) -> tuple[ProcessSlot, ...]:
        """Slots the monitor counts: those with ``status != 0`` (HAMi-core 1.2)."""
        return tuple(p for p in self.procs if p.status != 0)

    def used_memory_bytes(self, device: int) -> int:
        """Container usage of ``device`` in bytes: sum of ``total`` over active slots (HAMi-core
        1.2 MemoryTotal)."""
        return sum(p.devices[device].used_memory_bytes for p in self.active_procs())

    def context_bytes(self, device: int) -> int:
        """Sum of context bytes on ``device`` over active slots (HAMi-core 1.2 ContextSize)."""
        return sum(p.devices[device].context_bytes for p in self.active_procs())

    def data_bytes(self, device: int) -> int:
        """Sum of data ("buffer") bytes on ``device`` over active slots (HAMi-core 1.2
        BufferSize)."""
        return sum(p.devices[device].data_bytes for p in self.active_procs())

    def sm_util_percent(self, device: int) -> int:
        """Sum of per-process SM utilisation on ``device`` over active slots (HAMi-core 1.2
        SmUtil)."""
        return sum(p.sm_util_percent[device] for p in self.active_procs())


def detect_layout(buf: bytes | bytearray | memoryview, size: int | None = None) -> _Layout:
    """Return the layout of a region or raise :class:`RegionError` (HAMi-core 1.2 rules).

    ``buf`` holds at least the region's first 12 bytes; ``size`` is the file's size in
    bytes (default ``len(buf)``).
    """
    size = len(buf) if size is None else size
    if size < 12 or len(buf) < 12:
        raise RegionError(f"region too small: {size} bytes")
    magic, major = struct.unpack_from("<iI", buf, 0)
    if magic != MAGIC:
        raise RegionError(f"bad magic {magic:#x} (expected {MAGIC:#x}): not a libvgpu region")
    if V0_SIZE <= size < V1_SIZE:
        return _V0
    if major == 1 and size >= V1_SIZE:
        return _V1
    raise RegionError(f"unknown region: size {size} bytes, major version {major}")


#: ``read(offset, length) -> bytes``: at most ``length`` bytes of the file at ``offset``
#: (fewer at the end of the file), e.g. ``os.pread`` on a file descriptor.
Reader = Callable[[int, int], "bytes | bytearray | memoryview"]


def parse_region(buf: bytes | bytearray | memoryview) -> Region:
    """Parse a whole region file image (``bytes``, ``bytearray`` or ``memoryview``).

    The trailing extra byte of the on-disk file is ignored. Raises :class:`RegionError`
    (a ``ValueError``) when the buffer is truncated, has the wrong magic, an unknown
    version, or an out-of-range ``proc_num``/``device_num``.
    """
    mv = memoryview(buf)
    return read_region(lambda off, n: mv[off:off + n], len(mv))


def _exact(read: Reader, off: int, n: int) -> memoryview:
    data = memoryview(read(off, n))
    if len(data) != n:
        raise RegionError(f"short read: {len(data)} of {n} bytes at offset {off} (file truncated?)")
    return data


def read_region(read: Reader, size: int) -> Region:
    """Parse a region of ``size`` bytes through ``read`` (three reads: the header up to the
    process slots, the trailer fields, and the ``proc_num`` slots in use).

    Only what the monitor reads is fetched (a few kB for a container with a few
    processes, at most ~2 MB). Raises :class:`RegionError` like :func:`parse_region`, also
    when a read returns fewer bytes than asked (the file shrank meanwhile).
    """
    lay = detect_layout(_exact(read, 0, min(size, 12)) if size >= 12 else b"", size)
    head = _exact(read, 0, lay.off_procs)
    tail_len = 24 if lay.off_last_kernel_time else 16
    tail = _exact(read, lay.off_proc_num, tail_len)
    if lay.version == 1:
        _, major, minor = struct.unpack_from("<iII", head, 0)
        (owner_pid,) = struct.unpack_from("<Q", head, 16)
    else:
        major, minor = 0, 0
        (owner_pid,) = struct.unpack_from("<Q", head, 8)
    (device_num,) = struct.unpack_from("<Q", head, lay.off_device_num)
    if device_num > 1024:
        raise RegionError(f"corrupt region: device_num {device_num}")
    ndev = min(device_num, MAX_DEVICES)
    uuids = tuple(
        bytes(head[lay.off_uuids + i * UUID_LEN : lay.off_uuids + (i + 1) * UUID_LEN])
        .split(b"\0", 1)[0]
        .decode("utf-8", "replace")
        for i in range(ndev)
    )
    limits = struct.unpack_from(f"<{MAX_DEVICES}Q", head, lay.off_limit)
    sm_limits = struct.unpack_from(f"<{MAX_DEVICES}Q", head, lay.off_sm_limit)
    proc_num, util_switch, recent_kernel, priority = struct.unpack_from("<4i", tail, 0)
    if not 0 <= proc_num <= MAX_PROCS:
        raise RegionError(f"corrupt region: proc_num {proc_num}")
    lkt = struct.unpack_from("<Q", tail, 16)[0] if lay.off_last_kernel_time else 0
    slots = _exact(read, lay.off_procs, proc_num * lay.slot_size) if proc_num else memoryview(b"")
    procs = tuple(_parse_slot(slots, lay, i) for i in range(proc_num))
    return Region(
        version=(major, minor),
        device_count=ndev,
        uuids=uuids,
        limit_bytes=tuple(limits),
        sm_limit_percent=tuple(sm_limits),
        proc_num=proc_num,
        procs=procs,
        utilization_switch=util_switch,
        recent_kernel=recent_kernel,
        priority=priority,
        last_kernel_time=lkt,
        owner_pid=owner_pid,
    )


def _parse_slot(mv: memoryview, lay: _Layout, index: int) -> ProcessSlot:
    """Slot ``index`` of ``mv``, which holds the slots from the first one on."""
    base = index * lay.slot_size
    pid, host_pid = struct.unpack_from("<ii", mv, base)
    nfields = lay.devmem_size // 8
    devices = []
    for d in range(MAX_DEVICES):
        vals = struct.unpack_from(f"<{nfields}Q", mv, base + 8 + d * lay.devmem_size)
        devices.append(DeviceUsage(vals[0], vals[1], vals[2], vals[3], vals[4]))
    monitor = struct.unpack_from(f"<{MAX_DEVICES}Q", mv, base + lay.off_slot_monitorused)
    sm = tuple(
        struct.unpack_from("<Q", mv, base + lay.off_slot_util + d * lay.devutil_size + 16)[0]
        for d in range(MAX_DEVICES)
    )
    (status,) = struct.unpack_from("<i", mv, base + lay.off_slot_status)
    return ProcessSlot(index, pid, host_pid, status, tuple(devices), tuple(monitor), sm)


# offsets of the fields the monitor writes (HAMi-core 1.2), for writers of test images
V1_OFFSETS = {
    "recent_kernel": 2_008_904,
    "utilization_switch": 2_008_900,
    "priority": 2_008_908,
    "proc_num": 2_008_896,
    "last_kernel_time": 2_008_912,
}


def write_int32(buf: memoryview | bytearray, field: str, value: int) -> None:
    """Write a v1 int32 feedback field (``recent_kernel`` or ``utilization_switch``) into a writable buffer."""
    if field not in ("recent_kernel", "utilization_switch"):
        raise ValueError(f"field {field!r} is not monitor-writable")
    if len(buf) < V1_SIZE:
        raise RegionError("buffer too small for a v1 region")
    struct.pack_into("<i", buf, V1_OFFSETS[field], value)
