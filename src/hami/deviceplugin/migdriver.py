"""MIG instance operations behind the discovery interface (HAMi-core 1.2 and HAMi v2.10):
the :class:`MigDriver` protocol, what it returns and the error it raises.

Two implementations:

* :class:`~hami.deviceplugin.mignvml.NvmlMig` — ``nvidia-ml-py``: GPU-instance profile
  info, possible placements, create a GPU instance at a placement plus its full compute
  instance, list and destroy.
* :class:`~hami.deviceplugin.migfake.FakeMig` — the fake inventory's MIG-capable GPUs,
  with the instance table in a JSON file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

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
