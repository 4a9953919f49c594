"""MIG over the fake inventory (:class:`FakeMig`, a :class:`~hami.deviceplugin.migdriver.MigDriver`).

Profiles come from the YAML inventory; the instance table lives in a JSON file next to the
inventory (``<inventory>.mig-state.json``), so it survives a plugin restart like the
driver's state does, and tests can read it. Creates are refused like the driver refuses
them (unknown profile, placement not possible for the profile, overlap, instance count).

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
from pathlib import Path
from typing import Any

import yaml

from hami.core.model import MigPlacement
from hami.deviceplugin.migdriver import SLICE_PROFILES, GiProfileInfo, MigDriverError, MigInstance


def fake_mig_uuid(gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """Deterministic ``MIG-<uuid>`` for a fake instance (same GPU/GI/CI -> same UUID)."""
    return "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL,
                                      f"hami-fake-mig/{gpu_uuid}/{gpu_instance_id}/{compute_instance_id}"))


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
        profiles = [_gi_profile(p, f"gpus[{n}].mig_profiles[{m}]")
                    for m, p in enumerate(entry.get("mig_profiles") or [])]
        for _ in range(count):
            if profiles and k < len(gpu_uuids):
                out[gpu_uuids[k]] = tuple(profiles)
            k += 1
    return out, _seeds(raw.get("mig_instances") or [])


def _gi_profile(p: Any, where: str) -> GiProfileInfo:
    """One ``mig_profiles`` item. Raises :class:`MigDriverError`."""
    if not isinstance(p, dict):
        raise MigDriverError(f"{where} must be a mapping")
    slices = _int(p.get("slices"), f"{where}.slices", 1)
    if slices not in SLICE_PROFILES:
        raise MigDriverError(f"{where}.slices {slices} has no NVML profile "
                             f"({sorted(SLICE_PROFILES)})")
    places = p.get("placements") or []
    if not isinstance(places, list):
        raise MigDriverError(f"{where}.placements must be a list")
    return GiProfileInfo(
        slices=slices, profile_id=SLICE_PROFILES[slices][0],
        memory_mib=_int(p.get("memory_mib"), f"{where}.memory_mib", 1),
        multiprocessors=_int(p.get("sms"), f"{where}.sms", 1),
        instance_count=_int(p.get("instances", len(places)), f"{where}.instances"),
        placements=tuple(_placement(x, f"{where}.placements[{i}]")
                         for i, x in enumerate(places)))


def _seeds(items: Sequence[Any]) -> list[dict[str, int | str]]:
    """The ``mig_instances`` items (instances before the plugin starts). Raises
    :class:`MigDriverError`."""
    seeds: list[dict[str, int | str]] = []
    for n, s in enumerate(items):
        where = f"mig_instances[{n}]"
        if not isinstance(s, dict) or not isinstance(s.get("uuid"), str):
            raise MigDriverError(f"{where} needs a 'uuid'")
        seeds.append({"uuid": s["uuid"], "slices": _int(s.get("slices"), f"{where}.slices", 1),
                      "start": _int(s.get("start"), f"{where}.start"),
                      "size": _int(s.get("size"), f"{where}.size", 1)})
    return seeds


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
