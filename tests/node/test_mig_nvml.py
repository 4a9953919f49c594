""":class:`~hami.deviceplugin.mignvml.NvmlMig` against a stand-in for the NVML library
(the protocol boundary): the real ``pynvml`` structures, constants and error class, with
the library calls answered from an in-memory A100-like GPU. It checks the call sequence
and argument plumbing (placements array, GI/CI ids, MIG device lookup, cleanup on a
failed create); it cannot show that a real driver accepts the calls (never run on a GPU).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml")

from hami.core.model import MigPlacement  # noqa: E402
from hami.deviceplugin.migdriver import MigDriverError  # noqa: E402
from hami.deviceplugin.mignvml import NvmlMig  # noqa: E402

P = MigPlacement
GPU = "GPU-a100a100-1111-2222-3333-444444444444"
# GI profile id -> (slices, memory MiB, SMs, instance count, placements)
PROFILES = {0: (1, 4864, 14, 7, [(s, 1) for s in range(7)]),
            1: (2, 9856, 28, 3, [(0, 2), (2, 2), (4, 2)]),
            2: (3, 19968, 42, 2, [(0, 4), (4, 4)]),
            4: (7, 40192, 98, 1, [(0, 8)])}


def _ptr(kind: Any, value: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(value), kind)


def _addr(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class FakeNvml:
    """The subset of the ``pynvml`` module NvmlMig calls."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = pynvml.c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = pynvml.c_nvmlComputeInstance_t

    def __init__(self, mig_on: bool = True) -> None:
        self.mig_on = mig_on
        self.gis: dict[int, tuple[int, tuple[int, int]]] = {}   # gi id -> (profile, placement)
        self.cis: dict[int, int] = {}                           # gi id -> ci id
        self.calls: list[str] = []
        self.fail_ci = False

    def _err(self, code: int) -> Exception:
        return pynvml.NVMLError(code)

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        return [1 if self.mig_on else 0, 1 if self.mig_on else 0]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Any, profile: int) -> Any:
        if profile not in PROFILES:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slices, mem, sms, count, _ = PROFILES[profile]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.memorySizeMB = profile, slices, mem
        info.multiprocessorCount, info.instanceCount = sms, count
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: Any, pid: int, buf: Any, count: Any) -> int:
        places = PROFILES[pid][4]
        assert count._obj.value >= len(places)
        for i, (s, z) in enumerate(places):
            buf[i].start, buf[i].size = s, z
        count._obj.value = len(places)
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: Any, pid: int, place: Any) -> Any:
        self.calls.append(f"create_gi {pid} {place.start}+{place.size}")
        if (place.start, place.size) not in PROFILES[pid][4]:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for _, (s, z) in self.gis.values():
            if place.start < s + z and s < place.start + place.size:
                raise self._err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = min(set(range(1, 15)) - set(self.gis))
        self.gis[gi] = (pid, (place.start, place.size))
        return _ptr(pynvml.c_nvmlGpuInstance_t, 0x1000 + gi)

    def nvmlGpuInstanceGetInfo(self, gi: Any) -> Any:
        gid = _addr(gi) - 0x1000
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gid, self.gis[gid][0]
        info.placement.start, info.placement.size = self.gis[gid][1]
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: Any, profile: int, eng: int) -> Any:
        gid = _addr(gi) - 0x1000
        if PROFILES[self.gis[gid][0]][0] != {0: 1, 1: 2, 2: 3, 4: 7}.get(profile):
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = profile
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Any, pid: int) -> Any:
        gid = _addr(gi) - 0x1000
        self.calls.append(f"create_ci gi={gid} profile={pid}")
        if self.fail_ci:
            raise self._err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        self.cis[gid] = 0
        return _ptr(pynvml.c_nvmlComputeInstance_t, 0x100000 + gid * 16)

    def nvmlComputeInstanceGetInfo(self, ci: Any) -> Any:
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.id = (_addr(ci) - 0x100000) % 16
        return info

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, i: int) -> Any:
        gis = sorted(g for g in self.gis if g in self.cis)
        if i >= len(gis):
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", gis[i])

    def nvmlDeviceGetGpuInstanceId(self, mh: Any) -> int:
        return int(mh[1])

    def nvmlDeviceGetComputeInstanceId(self, mh: Any) -> int:
        return self.cis[mh[1]]

    def nvmlDeviceGetUUID(self, mh: Any) -> bytes:
        return f"MIG-nvml-{mh[1]}-{self.cis[mh[1]]}".encode()

    def nvmlDeviceGetGpuInstances(self, h: Any, pid: int, buf: Any, count: Any) -> int:
        mine = sorted(g for g, (p, _) in self.gis.items() if p == pid)
        for i, g in enumerate(mine):
            buf[i] = _ptr(pynvml.c_nvmlGpuInstance_t, 0x1000 + g)
        count._obj.value = len(mine)
        return 0

    def nvmlGpuInstanceGetComputeInstances(self, gi: Any, pid: int, buf: Any, count: Any) -> int:
        gid = _addr(gi) - 0x1000
        n = 1 if gid in self.cis else 0
        if n:
            buf[0] = _ptr(pynvml.c_nvmlComputeInstance_t, 0x100000 + gid * 16)
        count._obj.value = n
        return 0

    def nvmlComputeInstanceDestroy(self, ci: Any) -> int:
        gid = (_addr(ci) - 0x100000) // 16
        self.calls.append(f"destroy_ci gi={gid}")
        del self.cis[gid]
        return 0

    def nvmlGpuInstanceDestroy(self, gi: Any) -> int:
        gid = _addr(gi) - 0x1000
        self.calls.append(f"destroy_gi {gid}")
        if gid in self.cis:
            raise self._err(pynvml.NVML_ERROR_IN_USE)
        del self.gis[gid]
        return 0

    def nvmlDeviceGetGpuInstanceById(self, h: Any, gid: int) -> Any:
        if gid not in self.gis:
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return _ptr(pynvml.c_nvmlGpuInstance_t, 0x1000 + gid)


def driver(nv: FakeNvml) -> NvmlMig:
    return NvmlMig(nv, {GPU: object()}.__getitem__)


def test_profiles_from_nvml() -> None:
    infos = driver(FakeNvml()).profiles(GPU)
    assert [(i.slices, i.profile_id, i.memory_mib, i.multiprocessors, i.instance_count)
            for i in infos] == [(1, 0, 4864, 14, 7), (2, 1, 9856, 28, 3), (3, 2, 19968, 42, 2),
                                (7, 4, 40192, 98, 1)]
    assert infos[2].placements == (P(0, 4), P(4, 4))
    assert driver(FakeNvml(mig_on=False)).profiles(GPU) == []
    with pytest.raises(MigDriverError, match="unknown GPU"):
        driver(FakeNvml()).profiles("GPU-other")


def test_create_list_destroy() -> None:
    nv = FakeNvml()
    d = driver(nv)
    a = d.create(GPU, 3, P(4, 4))
    assert (a.gpu_instance_id, a.compute_instance_id, a.mig_uuid, a.placement) == (
        1, 0, "MIG-nvml-1-0", P(4, 4))
    b = d.create(GPU, 1, P(0, 1))
    assert nv.calls[:2] == ["create_gi 2 4+4", "create_ci gi=1 profile=2"]
    assert d.instances(GPU) == [a, b]
    with pytest.raises(MigDriverError, match="create 1g at 5\\+1"):
        d.create(GPU, 1, P(5, 1))                   # overlaps the 3g instance
    d.destroy(GPU, 1)
    assert nv.calls[-2:] == ["destroy_ci gi=1", "destroy_gi 1"]
    assert d.instances(GPU) == [b]
    with pytest.raises(MigDriverError, match="destroy GPU instance 9"):
        d.destroy(GPU, 9)


def test_failed_compute_instance_leaves_no_gpu_instance() -> None:
    nv = FakeNvml()
    nv.fail_ci = True
    with pytest.raises(MigDriverError):
        driver(nv).create(GPU, 7, P(0, 8))
    assert nv.gis == {} and nv.calls[-1] == "destroy_gi 1"
