"""Write libvgpu shared-region files byte for byte at the offsets of hami-core-spec §A.6.1,
independently of the reader under test."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

MAGIC = 19920718
V1_FILE = 2_008_953
V0_FILE = 1_197_897


@dataclass
class Proc:
    pid: int = 100
    hostpid: int = 0
    status: int = 1
    #: per device index: (context, module, data, offset, total) bytes
    used: dict[int, tuple[int, int, int, int, int]] = field(default_factory=dict)
    sm_util: dict[int, int] = field(default_factory=dict)
    monitorused: dict[int, int] = field(default_factory=dict)


@dataclass
class RegionSpec:
    version: int = 1                 # 1 (1.2 layout) or 0 (legacy)
    minor: int = 2
    uuids: tuple[str, ...] = ()
    limits: dict[int, int] = field(default_factory=dict)
    sm_limits: dict[int, int] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    proc_num: int | None = None
    utilization_switch: int = 1
    recent_kernel: int = 2
    priority: int = 1
    last_kernel_time: int = 0
    device_num: int | None = None


def build(spec: RegionSpec) -> bytearray:
    v1 = spec.version == 1
    buf = bytearray(V1_FILE if v1 else V0_FILE)
    if v1:
        o = dict(num=56, uuids=64, limit=1600, sm=1728, procs=1856, slot=1960, dm=64,
                 mon=1032, util=1160, du=48, status=1928, proc_num=2_008_896, lkt=2_008_912)
        struct.pack_into("<iII", buf, 0, MAGIC, 1, spec.minor)
    else:
        o = dict(num=48, uuids=56, limit=1592, sm=1720, procs=1848, slot=1168, dm=40,
                 mon=648, util=776, du=24, status=1160, proc_num=1_197_880, lkt=None)
        struct.pack_into("<i", buf, 0, MAGIC)
    struct.pack_into("<Q", buf, o["num"], len(spec.uuids) if spec.device_num is None else spec.device_num)
    for i, u in enumerate(spec.uuids):
        raw = u.encode()[:96]
        buf[o["uuids"] + 96 * i: o["uuids"] + 96 * i + len(raw)] = raw
    for i, v in spec.limits.items():
        struct.pack_into("<Q", buf, o["limit"] + 8 * i, v)
    for i, v in spec.sm_limits.items():
        struct.pack_into("<Q", buf, o["sm"] + 8 * i, v)
    for n, p in enumerate(spec.procs):
        base = o["procs"] + n * o["slot"]
        struct.pack_into("<ii", buf, base, p.pid, p.hostpid)
        for d, vals in p.used.items():
            struct.pack_into("<5Q", buf, base + 8 + d * o["dm"], *vals)
        for d, v in p.monitorused.items():
            struct.pack_into("<Q", buf, base + o["mon"] + 8 * d, v)
        for d, v in p.sm_util.items():
            struct.pack_into("<Q", buf, base + o["util"] + d * o["du"] + 16, v)
        struct.pack_into("<i", buf, base + o["status"], p.status)
    pn = len(spec.procs) if spec.proc_num is None else spec.proc_num
    struct.pack_into("<4i", buf, o["proc_num"], pn, spec.utilization_switch, spec.recent_kernel,
                     spec.priority)
    if v1:
        struct.pack_into("<Q", buf, o["lkt"], spec.last_kernel_time)
    return buf


def read_feedback(data: bytes, version: int = 1) -> tuple[int, int]:
    """(utilization_switch, recent_kernel) straight from the offsets."""
    off = 2_008_900 if version == 1 else 1_197_884
    sw, rk = struct.unpack_from("<ii", data, off)
    return sw, rk


ALLOCATED = "hami.io/vgpu-devices-allocated"


def allocated(*containers: tuple[str, ...], mem_mib: int = 1000, cores: int = 10) -> dict[str, str]:
    """``{"hami.io/vgpu-devices-allocated": ...}`` granting container k (init containers
    first) the GPUs ``containers[k]``, in the scheduler's format (spec §2.4)."""
    value = "".join("".join(f"{u},NVIDIA,{mem_mib},{cores}:" for u in c) + ";" for c in containers)
    return {ALLOCATED: value}
