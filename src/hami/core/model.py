"""The scheduling vocabulary as frozen values (HAMi v2.10 terms, units in names).

Source (HAMi v2.10): (requests), (node devices),
(pod devices), (usage). Memory is always MiB after ``memoryFactor``; cores are
percent of one physical GPU (100 = whole GPU when ``deviceCoreScaling`` is 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: ``MemPercentagereq`` sentinel meaning "no percentage given" (HAMi v2.10 step 3).
PERCENT_UNSET = 101


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """A MIG placement: GPU slices ``[start, start + size)`` (HAMi v2.10)."""

    start: int
    size: int

    def overlaps(self, other: MigPlacement) -> bool:
        """True when the two slice ranges intersect."""
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile a GPU can host (node register ``migProfiles`` entry, HAMi v2.10)."""

    name: str
    memory_mib: int
    cores_percent: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One physical GPU as registered by a node's device plugin (HAMi v2.10).

    ``memory_mib`` and ``cores_percent`` are already multiplied by the node's memory and
    core scaling; ``split_count`` is the number of tasks that may share the GPU.
    """

    uuid: str
    index: int
    split_count: int
    memory_mib: int
    cores_percent: int
    type: str
    numa: int = 0
    mode: str = ""
    health: bool = True
    mig_profiles: tuple[MigProfile, ...] = ()
    vendor: str = "NVIDIA"


@dataclass(frozen=True, slots=True)
class ContainerDeviceRequest:
    """What one container asks of one vendor (HAMi ``ContainerDeviceRequest``, HAMi v2.10).

    ``memory_percent`` is :data:`PERCENT_UNSET` (101) when no percentage applies; a
    ``memory_mib`` of 0 with a set percentage means "that share of each chosen card".
    """

    nums: int
    type: str = "NVIDIA"
    memory_mib: int = 0
    memory_percent: int = PERCENT_UNSET
    cores_percent: int = 0

    def memory_on(self, device_memory_mib: int) -> int:
        """MiB this request books on a card of ``device_memory_mib`` (HAMi v2.10 step 9).

        The percentage is applied with integer floor after the multiplication, so 20 % of
        32768 MiB is 6553 MiB (field case B23) and 100 % is exactly the card.
        """
        if self.memory_mib > 0:
            return self.memory_mib
        if self.memory_percent != PERCENT_UNSET:
            return device_memory_mib * self.memory_percent // 100
        return 0


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One device granted to one container (an entry of the pod device string, HAMi v2.10)."""

    uuid: str
    type: str
    used_memory_mib: int
    used_cores_percent: int
    index: int = 0


#: Devices of one container, in grant order.
ContainerDevices = tuple[ContainerDevice, ...]
#: Devices of every container of a pod, init containers first (HAMi ``PodSingleDevice``).
PodSingleDevice = tuple[ContainerDevices, ...]


@dataclass(frozen=True, slots=True)
class DeviceCharge:
    """The usage a pod holds on one GPU after init-container collapse (HAMi v2.10).

    ``slots`` is how many of the GPU's ``split_count`` task slots the pod occupies.
    """

    uuid: str
    memory_mib: int
    cores_percent: int
    slots: int = 1


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Everything the scheduler needs to know about one pod's GPU needs.

    ``containers`` holds one entry per container, init containers first; an entry is
    ``None`` for a container that asks for no device. ``n_init`` is how many of them are
    init containers. Annotations are the pod's (user options such as
    ``nvidia.com/use-gputype`` are read from them by :mod:`hami.core.fit`).

    ``vendors`` holds, per container in the same order, the requests of the registered
    vendors other than NVIDIA keyed by CommonWord (``{"DCU": ...}``; ``{}`` for none);
    it is ``()`` when no such vendor is registered or no container asks for one (HAMi v2.10
    ``Resourcereqs``: one request per vendor per container).
    """

    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerDeviceRequest | None, ...]
    n_init: int = 0
    annotations: dict[str, str] = field(default_factory=dict)
    cpu_milli: int = 0
    memory_mib: int = 0
    vendors: tuple[Mapping[str, ContainerDeviceRequest], ...] = ()

    @property
    def wants_devices(self) -> bool:
        """True when at least one container requests a device of any vendor."""
        return (any(c is not None and c.nums > 0 for c in self.containers)
                or any(self.vendors))

    @property
    def vendor_words(self) -> tuple[str, ...]:
        """CommonWords of the non-NVIDIA vendors some container asks for, sorted."""
        return tuple(sorted({word for reqs in self.vendors for word in reqs}))
