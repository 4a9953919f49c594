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


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}


def csv_list(value: str | None, lower: bool = False) -> tuple[str, ...]:
    """A comma list, entries trimmed (lower-cased with ``lower``), empties dropped."""
    if not value or not value.strip():
        return ()
    items = (p.strip() for p in value.split(","))
    return tuple(p.lower() if lower else p for p in items if p)


@dataclass(frozen=True, slots=True)
class CardFilters:
    """The pod annotation keys a vendor reads to include/exclude its cards (HAMi v2.10),
    from the vendor's table row (NVIDIA's: ``nvidia.com/use-gputype`` ...).

    Empty keys mean the vendor has no such filter. Types match case-insensitively by
    substring (HAMi ``CheckType``), UUIDs exactly (``CheckUUID``). ``mode`` is the key of
    the card-mode filter (NVIDIA's ``nvidia.com/vgpu-mode``); ``mig``: the vendor's cards
    may be in MIG mode, whose instances :func:`hami.core.fit.fit_shares` places (else a card's mode
    never makes it a MIG card). ``node_scores``: the node annotation holding the vendor's
    card-pair topology scores for the ``topology-aware`` policy (NVIDIA's
    ``hami.io/node-nvidia-score``; empty: none).
    """

    use_type: str = ""
    nouse_type: str = ""
    use_uuid: str = ""
    nouse_uuid: str = ""
    numa_bind: str = ""
    mode: str = ""
    mig: bool = False
    node_scores: str = ""

    def type_ok(self, anns: Mapping[str, str], device_type: str) -> bool:
        """``CheckType`` with this vendor's keys."""
        t = device_type.lower()
        use = csv_list(anns.get(self.use_type), lower=True) if self.use_type else ()
        nouse = csv_list(anns.get(self.nouse_type), lower=True) if self.nouse_type else ()
        if use and not any(u in t for u in use):
            return False
        return not any(n in t for n in nouse)

    def uuids(self, anns: Mapping[str, str]) -> tuple[frozenset[str], frozenset[str]]:
        """``(use, nouse)`` UUID sets."""
        use = frozenset(csv_list(anns.get(self.use_uuid))) if self.use_uuid else frozenset()
        nouse = frozenset(csv_list(anns.get(self.nouse_uuid))) if self.nouse_uuid else frozenset()
        return use, nouse

    def numa(self, anns: Mapping[str, str]) -> bool:
        """Go ``ParseBool`` true of the numa-bind annotation."""
        return bool(self.numa_bind) and anns.get(self.numa_bind, "") in _TRUE


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Everything the scheduler needs to know about one pod's GPU needs.

    ``containers`` holds one entry per container, init containers first; an entry is
    ``None`` for a container that asks for no device. ``n_init`` is how many of them are
    init containers, ``sidecars`` the positions of the restartable ones among them
    (``restartPolicy: Always``: charged for the pod's life, :mod:`hami.core.collapse`).
    Annotations are the pod's (user options such as
    ``nvidia.com/use-gputype`` are read from them by :mod:`hami.core.fit`);
    ``share_filters`` are the filter keys of the vendor whose requests ``containers``
    holds (the share fast-path backend's, NVIDIA's with HAMi's vendors, set by
    :func:`hami.core.request.pod_request`; no keys and no MIG by default).

    ``vendors`` holds, per container in the same order, the requests of the registered
    vendors other than the fast-path one keyed by CommonWord (``{"DCU": ...}``; ``{}`` for none);
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
    share_filters: CardFilters = CardFilters()
    sidecars: frozenset[int] = frozenset()

    @property
    def wants_devices(self) -> bool:
        """True when at least one container requests a device of any vendor."""
        return (any(c is not None and c.nums > 0 for c in self.containers)
                or any(self.vendors))

    @property
    def vendor_words(self) -> tuple[str, ...]:
        """CommonWords of the per-vendor entries (:attr:`vendors`) some container asks
        for, sorted."""
        return tuple(sorted({word for reqs in self.vendors for word in reqs}))
