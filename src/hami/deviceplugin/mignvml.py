"""MIG through ``nvidia-ml-py`` (:class:`NvmlMig`, a
:class:`~hami.deviceplugin.migdriver.MigDriver`): GPU-instance profile info, possible
placements, create a GPU instance at a placement plus its full compute instance, list and
destroy. Thin on purpose: it has never run against a real MIG GPU in this project's tests.
"""

from __future__ import annotations

from typing import Any

from hami.core.model import MigPlacement
from hami.deviceplugin.migdriver import SLICE_PROFILES, GiProfileInfo, MigDriverError, MigInstance


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlMig:
    """MIG through ``pynvml``. ``handle_of(uuid)`` returns the NVML device handle."""

    def __init__(self, nv: Any, handle_of: Any) -> None:
        self.nv = nv
        self.handle_of = handle_of

    def _handle(self, gpu_uuid: str) -> Any:
        try:
            return self.handle_of(gpu_uuid)
        except KeyError:
            raise MigDriverError(f"{gpu_uuid}: unknown GPU") from None

    def profiles(self, gpu_uuid: str) -> list[GiProfileInfo]:
        nv, h = self.nv, self._handle(gpu_uuid)
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(h)
        except nv.NVMLError:
            return []
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for slices, (gi_profile, _ci) in sorted(SLICE_PROFILES.items()):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, gi_profile)
            except nv.NVMLError:
                continue  # profile not supported by this GPU
            out.append(GiProfileInfo(slices, int(info.id), int(info.memorySizeMB),
                                     int(info.multiprocessorCount), int(info.instanceCount),
                                     self._placements(h, int(info.id), int(info.instanceCount))))
        return out

    def _placements(self, h: Any, profile_id: int, instance_count: int) -> tuple[MigPlacement, ...]:
        import ctypes

        nv = self.nv
        n = max(instance_count, 1) * 8
        buf = (nv.c_nvmlGpuInstancePlacement_t * n)()
        count = ctypes.c_uint(n)
        try:
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, buf, ctypes.byref(count))
        except nv.NVMLError as exc:
            raise MigDriverError(f"NVML possible placements: {exc}") from None
        return tuple(MigPlacement(int(buf[i].start), int(buf[i].size)) for i in range(count.value))

    def _gpu_instances(self, h: Any) -> list[tuple[int, Any]]:
        import ctypes

        nv = self.nv
        found: list[tuple[int, Any]] = []
        for slices, (gi_profile, _ci) in SLICE_PROFILES.items():
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, gi_profile)
            except nv.NVMLError:
                continue
            n = max(int(info.instanceCount), 1)
            buf = (nv.c_nvmlGpuInstance_t * n)()
            count = ctypes.c_uint(n)
            try:
                nv.nvmlDeviceGetGpuInstances(h, int(info.id), buf, ctypes.byref(count))
            except nv.NVMLError as exc:
                raise MigDriverError(f"NVML list GPU instances: {exc}") from None
            found.extend((slices, buf[i]) for i in range(count.value))
        return found

    def _describe(self, gpu_uuid: str, h: Any, slices: int, gi: Any) -> MigInstance:
        import ctypes

        nv = self.nv
        info = nv.nvmlGpuInstanceGetInfo(gi)
        ci_id, mig_uuid = -1, ""
        ci_profile = SLICE_PROFILES[slices][1]
        try:
            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_profile, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            buf = (nv.c_nvmlComputeInstance_t * 1)()
            count = ctypes.c_uint(1)
            nv.nvmlGpuInstanceGetComputeInstances(gi, int(ci_info.id), buf, ctypes.byref(count))
            if count.value:
                ci_id = int(nv.nvmlComputeInstanceGetInfo(buf[0]).id)
                mig_uuid = self._mig_uuid(h, int(info.id), ci_id)
        except nv.NVMLError:
            pass
        return MigInstance(gpu_uuid, slices, MigPlacement(int(info.placement.start),
                                                          int(info.placement.size)),
                           int(info.id), ci_id, mig_uuid)

    def _mig_uuid(self, h: Any, gi_id: int, ci_id: int) -> str:
        nv = self.nv
        for i in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except nv.NVMLError:
                continue
            if (int(nv.nvmlDeviceGetGpuInstanceId(mh)) == gi_id
                    and int(nv.nvmlDeviceGetComputeInstanceId(mh)) == ci_id):
                return _text(nv.nvmlDeviceGetUUID(mh))
        raise MigDriverError(f"no MIG device for GPU instance {gi_id} compute instance {ci_id}")

    def instances(self, gpu_uuid: str) -> list[MigInstance]:
        nv, h = self.nv, self._handle(gpu_uuid)
        try:
            out = [self._describe(gpu_uuid, h, s, gi) for s, gi in self._gpu_instances(h)]
        except nv.NVMLError as exc:
            raise MigDriverError(f"NVML: {exc}") from None
        return sorted(out, key=lambda m: m.gpu_instance_id)

    def create(self, gpu_uuid: str, slices: int, placement: MigPlacement) -> MigInstance:
        nv, h = self.nv, self._handle(gpu_uuid)
        if slices not in SLICE_PROFILES:
            raise MigDriverError(f"no NVML profile for {slices}g")
        gi_profile, ci_profile = SLICE_PROFILES[slices]
        gi = None
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, gi_profile)
            place = nv.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, int(info.id), place)
            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_profile, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_info.id))
            gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
            ci_id = int(nv.nvmlComputeInstanceGetInfo(ci).id)
            return MigInstance(gpu_uuid, slices, placement, gi_id, ci_id,
                               self._mig_uuid(h, gi_id, ci_id))
        except (nv.NVMLError, MigDriverError) as exc:
            if gi is not None:
                self._destroy_gi(gi)
            raise MigDriverError(f"{gpu_uuid}: create {slices}g at {placement.start}+"
                                 f"{placement.size}: {exc}") from None

    def _destroy_gi(self, gi: Any) -> None:
        import ctypes

        nv = self.nv
        for _slices, (_gp, ci_profile) in SLICE_PROFILES.items():
            try:
                ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_profile, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except nv.NVMLError:
                continue
            buf = (nv.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(8)
            try:
                nv.nvmlGpuInstanceGetComputeInstances(gi, int(ci_info.id), buf, ctypes.byref(count))
            except nv.NVMLError:
                continue
            for i in range(count.value):
                nv.nvmlComputeInstanceDestroy(buf[i])
        nv.nvmlGpuInstanceDestroy(gi)

    def destroy(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        nv, h = self.nv, self._handle(gpu_uuid)
        try:
            self._destroy_gi(nv.nvmlDeviceGetGpuInstanceById(h, gpu_instance_id))
        except nv.NVMLError as exc:
            raise MigDriverError(f"{gpu_uuid}: destroy GPU instance {gpu_instance_id}: {exc}") from None
