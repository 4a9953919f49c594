"""MIG instance operations behind the discovery interface (HAMi-core 1.2 and HAMi v2.10).

Two implementations of :class:`MigDriver`:

* :class:`NvmlMig` — ``nvidia-ml-py``: GPU-instance profile info, possible placements,
  create a GPU instance at a placement plus its full compute instance, list and destroy.
  Thin on purpose: it has never run against a real MIG GPU in this project's tests.
* :class:`FakeMig` — the fake inventory's MIG-capable GPUs. Profiles come from the YAML
  inventory; the instance table lives in a JSON file next to the inventory
  (``<inventory>.mig-state.json``), so it survives a plugin restart like the driver's
  state does, and tests can read it. Creates are refused like the driver refuses them
  (unknown profile, placement not possible for the profile, overlap, instance count).

Fake inventory keys (per ``gpus`` entry, see :mod:`hami.deviceplugin.discovery`)::

    mig_profiles:                # the GPU is MIG-capable; one item per GI profile
      - {slices: 1, memory_mib: 4864, sms: 14, instances: 7,
         placements: [[0, 1], [1, 1], [2, 1], [3, 1], [4, 1], [5, 1], [6, 1]]}
    # top level: instances that exist before the plugin starts (seed of the table)
    mig_instances:
      - {uuid: GPU-a, slices: 3, start: 4, size: 4}
"""

from __future__ import annotations

import json
import os
import threading
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from hami.core.model import MigPlacement

#: ``<N>g`` compute-slice prefix -> (NVML GPU-instance profile, NVML compute-instance
#: profile), the base (non-REV, with media engines shared) profiles of ``nvml.h``.
SLICE_PROFILES: Mapping[int, tuple[int, int]] = {
    1: (0, 0),  # NVML_GPU_INSTANCE_PROFILE_1_SLICE / NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    2: (1, 1),
    3: (2, 2),
    4: (3, 3),
    7: (4, 4),
    8: (5, 5),
    6: (6, 6),
}


class MigDriverError(RuntimeError):
    """A MIG operation failed (the driver refused it, or the GPU is unknown)."""


@dataclass(frozen=True, slots=True)
class GiProfileInfo:
    """One GPU-instance profile of a GPU, as NVML reports it.

    ``slices`` is the ``<N>`` of ``<N>g.*`` profile names (the compute slice count, also
    NVML's ``sliceCount``); ``profile_id`` the NVML GI profile constant; ``memory_mib``
    NVML's ``memorySizeMB``; ``multiprocessors`` its SM count; ``instance_count`` how many
    such instances fit on an empty GPU; ``placements`` NVML's possible placements.
    """

    slices: int
    profile_id: int
    memory_mib: int
    multiprocessors: int
    instance_count: int
    placements: tuple[MigPlacement, ...]


@dataclass(frozen=True, slots=True)
class MigInstance:
    """An existing GPU instance with its (first) compute instance.

    ``mig_uuid`` is the MIG device UUID (``MIG-…``) containers see; ``compute_instance_id``
    and ``mig_uuid`` are -1 / ``""`` when the GPU instance has no compute instance yet.
    """

    gpu_uuid: str
    slices: int
    placement: MigPlacement
    gpu_instance_id: int
    compute_instance_id: int
    mig_uuid: str


class MigDriver(Protocol):
    """MIG operations the plugin needs (per physical GPU UUID)."""

    def profiles(self, gpu_uuid: str) -> list[GiProfileInfo]:
        """GI profiles the GPU supports ([] when it is not MIG-capable or MIG is off).
        Raises :class:`MigDriverError`."""
        ...

    def instances(self, gpu_uuid: str) -> list[MigInstance]:
        """Existing GPU instances, by GI id. Raises :class:`MigDriverError`."""
        ...

    def create(self, gpu_uuid: str, slices: int, placement: MigPlacement) -> MigInstance:
        """Create a ``<slices>g`` GPU instance at ``placement`` and its full compute
        instance. Raises :class:`MigDriverError` (nothing is left behind on failure)."""
        ...

    def destroy(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        """Destroy the GPU instance's compute instances, then the GPU instance.
        Raises :class:`MigDriverError`."""
        ...


def fake_mig_uuid(gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """Deterministic ``MIG-<uuid>`` for a fake instance (same GPU/GI/CI -> same UUID)."""
    return "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL,
                                      f"hami-fake-mig/{gpu_uuid}/{gpu_instance_id}/{compute_instance_id}"))


# --- fake ----------------------------------------------------------------------------------


def _int(value: Any, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MigDriverError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _placement(value: Any, where: str) -> MigPlacement:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise MigDriverError(f"{where} must be [start, size]")
    return MigPlacement(_int(value[0], f"{where}[0]"), _int(value[1], f"{where}[1]", 1))


def parse_mig_inventory(text: str, gpu_uuids: Sequence[str]
                        ) -> tuple[dict[str, tuple[GiProfileInfo, ...]], list[dict[str, int | str]]]:
    """The MIG part of a fake inventory: profiles per GPU UUID and the seed instances.

    ``gpu_uuids`` are the UUIDs :func:`~hami.deviceplugin.discovery.parse_inventory`
    assigned, in file order. Raises :class:`MigDriverError` on a malformed entry.
    """
    raw = yaml.safe_load(text) or {}
    out: dict[str, tuple[GiProfileInfo, ...]] = {}
    k = 0
    for n, entry in enumerate(raw.get("gpus") or []):
        count = entry.get("count", 1)
        profiles = []
        for m, p in enumerate(entry.get("mig_profiles") or []):
            where = f"gpus[{n}].mig_profiles[{m}]"
            if not isinstance(p, dict):
                raise MigDriverError(f"{where} must be a mapping")
            slices = _int(p.get("slices"), f"{where}.slices", 1)
            if slices not in SLICE_PROFILES:
                raise MigDriverError(f"{where}.slices {slices} has no NVML profile "
                                     f"({sorted(SLICE_PROFILES)})")
            places = p.get("placements") or []
            if not isinstance(places, list):
                raise MigDriverError(f"{where}.placements must be a list")
            profiles.append(GiProfileInfo(
                slices=slices, profile_id=SLICE_PROFILES[slices][0],
                memory_mib=_int(p.get("memory_mib"), f"{where}.memory_mib", 1),
                multiprocessors=_int(p.get("sms"), f"{where}.sms", 1),
                instance_count=_int(p.get("instances", len(places)), f"{where}.instances"),
                placements=tuple(_placement(x, f"{where}.placements[{i}]")
                                 for i, x in enumerate(places))))
        for _ in range(count):
            if profiles and k < len(gpu_uuids):
                out[gpu_uuids[k]] = tuple(profiles)
            k += 1
    seeds: list[dict[str, int | str]] = []
    for n, s in enumerate(raw.get("mig_instances") or []):
        where = f"mig_instances[{n}]"
        if not isinstance(s, dict) or not isinstance(s.get("uuid"), str):
            raise MigDriverError(f"{where} needs a 'uuid'")
        seeds.append({"uuid": s["uuid"], "slices": _int(s.get("slices"), f"{where}.slices", 1),
                      "start": _int(s.get("start"), f"{where}.start"),
                      "size": _int(s.get("size"), f"{where}.size", 1)})
    return out, seeds


class FakeMig:
    """MIG over the fake inventory; the instance table is ``state_path`` (JSON)."""

    def __init__(self, inventory: Path, gpu_uuids: Sequence[str],
                 state_path: Path | None = None) -> None:
        self.inventory = inventory
        self.state_path = state_path or inventory.with_name(inventory.name + ".mig-state.json")
        self._profiles, seeds = parse_mig_inventory(inventory.read_text(), gpu_uuids)
        self._lock = threading.Lock()
        self.creates = 0
        self.destroys = 0
        if not self.state_path.exists():
            table: dict[str, list[dict[str, Any]]] = {}
            for s in seeds:
                rows = table.setdefault(str(s["uuid"]), [])
                gi = self._free_id(rows)
                rows.append({"slices": s["slices"], "start": s["start"], "size": s["size"],
                             "gi": gi, "ci": 0})
            self._save(table)

    # table I/O
    def _load(self) -> dict[str, list[dict[str, Any]]]:
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as exc:
            raise MigDriverError(f"fake MIG state {self.state_path}: {exc}") from None
        if not isinstance(data, dict):
            raise MigDriverError(f"fake MIG state {self.state_path} must be an object")
        return data

    def _save(self, table: Mapping[str, list[dict[str, Any]]]) -> None:
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
        os.replace(tmp, self.state_path)

    @staticmethod
    def _free_id(rows: Sequence[Mapping[str, Any]]) -> int:
        used = {int(r["gi"]) for r in rows}
        gi = 1
        while gi in used:
            gi += 1
        return gi

    def _known(self, gpu_uuid: str) -> tuple[GiProfileInfo, ...]:
        if gpu_uuid not in self._profiles:
            raise MigDriverError(f"{gpu_uuid}: not a MIG-capable GPU of the fake inventory")
        return self._profiles[gpu_uuid]

    def profiles(self, gpu_uuid: str) -> list[GiProfileInfo]:
        return list(self._profiles.get(gpu_uuid, ()))

    def instances(self, gpu_uuid: str) -> list[MigInstance]:
        self._known(gpu_uuid)
        with self._lock:
            rows = self._load().get(gpu_uuid, [])
        # a row with ci -1 is a GPU instance whose compute instance was never created
        return [MigInstance(gpu_uuid, int(r["slices"]), MigPlacement(int(r["start"]), int(r["size"])),
                            int(r["gi"]), int(r["ci"]),
                            fake_mig_uuid(gpu_uuid, int(r["gi"]), int(r["ci"])) if int(r["ci"]) >= 0
                            else "")
                for r in sorted(rows, key=lambda r: int(r["gi"]))]

    def create(self, gpu_uuid: str, slices: int, placement: MigPlacement) -> MigInstance:
        profile = next((p for p in self._known(gpu_uuid) if p.slices == slices), None)
        if profile is None:
            raise MigDriverError(f"{gpu_uuid}: no {slices}g GPU instance profile (not supported)")
        if placement not in profile.placements:
            raise MigDriverError(f"{gpu_uuid}: placement {placement.start}+{placement.size} is not "
                                 f"possible for the {slices}g profile (invalid argument)")
        with self._lock:
            table = self._load()
            rows = table.setdefault(gpu_uuid, [])
            for r in rows:
                if placement.overlaps(MigPlacement(int(r["start"]), int(r["size"]))):
                    raise MigDriverError(
                        f"{gpu_uuid}: placement {placement.start}+{placement.size} overlaps GPU "
                        f"instance {r['gi']} at {r['start']}+{r['size']} (insufficient resources)")
            if sum(1 for r in rows if int(r["slices"]) == slices) >= profile.instance_count:
                raise MigDriverError(f"{gpu_uuid}: {slices}g instance count "
                                     f"{profile.instance_count} reached (insufficient resources)")
            gi = self._free_id(rows)
            rows.append({"slices": slices, "start": placement.start, "size": placement.size,
                         "gi": gi, "ci": 0})
            self._save(table)
            self.creates += 1
        return MigInstance(gpu_uuid, slices, placement, gi, 0, fake_mig_uuid(gpu_uuid, gi, 0))

    def destroy(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        self._known(gpu_uuid)
        with self._lock:
            table = self._load()
            rows = table.get(gpu_uuid, [])
            keep = [r for r in rows if int(r["gi"]) != gpu_instance_id]
            if len(keep) == len(rows):
                raise MigDriverError(f"{gpu_uuid}: no GPU instance {gpu_instance_id} (not found)")
            table[gpu_uuid] = keep
            self._save(table)
            self.destroys += 1


# --- NVML ----------------------------------------------------------------------------------


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
