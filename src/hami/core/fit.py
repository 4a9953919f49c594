"""The share-of-a-card ``Fit``: can one container's request be met on one node, and with
which cards? Vendor-neutral: every vendor whose rules are "shares of a card: count,
memory, cores, type and UUID filters" (NVIDIA, Hygon DCU, Iluvatar, ...) runs
:func:`fit_shares`; the pod annotation keys of its filters come from the vendor's table
row (:class:`CardFilters`).

Source (HAMi v2.10): (fitInDevices), (the exact check
order), (reason tokens and ``GenReason``). Devices come in best-first order (the GPU
policy's ranking, :mod:`hami.core.score`); HAMi walks a worst-first list from its end,
which is the same thing.

A container's N devices are N distinct physical cards: a card is visited once per
container (field case B24), except a card in MIG mode (for vendors whose filters say
their cards have MIG modes), which may give a container several instances.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from hami.api.names import MODE_HAMI_CORE, MODE_MIG, NODE_DEVICE_CORDON
from hami.core.codec_scores import decode_node_scores
from hami.core.gowire import CodecError
from hami.core.mig import choose_instance, replay
from hami.core.model import (
    CardFilters,
    ContainerDevice,
    ContainerDeviceRequest,
    DeviceInfo,
    MigPlacement,
    csv_list,
)

# Reason tokens (HAMi v2.10).
CARD_TYPE_MISMATCH = "CardTypeMismatch"
CARD_UUID_MISMATCH = "CardUuidMismatch"
CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
CARD_NOT_HEALTH = "CardNotHealth"
CARD_CORDONED = "CardCordoned"
NUMA_NOT_FIT = "NumaNotFit"
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
DEVICE_TYPE_NOT_FOUND = "Device type not found"


@dataclass(slots=True)
class DeviceState:
    """A GPU with the usage seen by the pod being placed (a working copy)."""

    info: DeviceInfo
    used_slots: int
    used_memory_mib: int
    used_cores: int
    mig_occupied: list[MigPlacement] = field(default_factory=list)


def policy_contains(policy: str, word: str) -> bool:
    """HAMi ``PolicyContains``: ``word`` is one of the comma-separated entries."""
    return word in (p.strip() for p in policy.split(","))


@dataclass(frozen=True, slots=True)
class PodOptions:
    """A pod's device options from its annotations (HAMi v2.10), parsed once per filter.

    ``mig``: MIG-mode cards are placed by the MIG rule (:attr:`CardFilters.mig`).
    """

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    numa_bind: bool = False
    vgpu_mode: str | None = None
    gpu_policy: str = "spread"
    mig: bool = False

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str], gpu_policy: str,
                         filters: CardFilters) -> PodOptions:
        """Parse the pod's values of the vendor's filter keys ``filters`` (NVIDIA's:
        ``nvidia.com/use-gputype`` ... ``nvidia.com/vgpu-mode``); ``gpu_policy`` is the
        effective GPU policy (annotation override already applied)."""
        use, nouse = filters.uuids(annotations)
        return cls(
            use_types=(csv_list(annotations.get(filters.use_type), lower=True)
                       if filters.use_type else ()),
            nouse_types=(csv_list(annotations.get(filters.nouse_type), lower=True)
                         if filters.nouse_type else ()),
            use_uuids=use,
            nouse_uuids=nouse,
            numa_bind=filters.numa(annotations),
            vgpu_mode=annotations.get(filters.mode) if filters.mode else None,
            gpu_policy=gpu_policy,
            mig=filters.mig,
        )

    def type_ok(self, device_type: str) -> bool:
        """``CheckType`` (case-insensitive substrings) and the ``vgpu-mode`` filter."""
        t = device_type.lower()
        if self.use_types and not any(u in t for u in self.use_types):
            return False
        return not any(n in t for n in self.nouse_types)

    def mode_ok(self, device_mode: str) -> bool:
        """The device's mode is allowed by ``nvidia.com/vgpu-mode`` (contains)."""
        return self.vgpu_mode is None or (device_mode or MODE_HAMI_CORE) in self.vgpu_mode

    def uuid_ok(self, uuid: str) -> bool:
        """``CheckUUID`` against use/nouse UUID lists."""
        if self.use_uuids and uuid not in self.use_uuids:
            return False
        return uuid not in self.nouse_uuids


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """Per-node inputs of Fit: cordoned UUIDs and topology pair scores (HAMi v2.10)."""

    cordoned: frozenset[str] = frozenset()
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str],
                         scores_key: str = "") -> NodeOptions:
        """From a node's annotations: ``hami.io/device-cordon`` (comma list, trimmed) and
        the vendor's pair-score annotation ``scores_key`` (its
        :attr:`~hami.core.model.CardFilters.node_scores`, NVIDIA's
        ``hami.io/node-nvidia-score``; ``""``: no scores; a malformed value counts as no
        scores)."""
        cordon = annotations.get(NODE_DEVICE_CORDON, "")
        cordoned = frozenset(p.strip() for p in cordon.split(",") if p.strip())
        scores: Mapping[str, Mapping[str, int]] = {}
        raw = annotations.get(scores_key) if scores_key else None
        if raw:
            try:
                scores = decode_node_scores(raw)
            except CodecError:
                scores = {}
        return cls(cordoned=cordoned, pair_scores=scores)


@dataclass(frozen=True, slots=True)
class FitOutcome:
    """Result of fitting one container: the chosen devices, or a reason string."""

    ok: bool
    devices: tuple[ContainerDevice, ...] = ()
    reason: str = ""
    #: MIG instances chosen: ``(position in devices, profile name, placement)``.
    mig: tuple[tuple[int, str, MigPlacement], ...] = ()


def gen_reason(counts: Mapping[str, int], cards: int) -> str:
    """HAMi ``GenReason``: ``"<n>/<cards> <Token>"`` items sorted as plain strings, joined
    by ``", "`` (HAMi v2.10; quirk 10 kept: ``"10/12 X"`` sorts before ``"2/12 Y"``)."""
    return ", ".join(sorted(f"{n}/{cards} {token}" for token, n in counts.items() if n))


QuotaCheck = Callable[[Sequence[ContainerDevice]], bool]


def of_type(devices: Sequence[DeviceState], kind: str) -> list[DeviceState]:
    """The cards whose type contains ``kind`` (case-insensitive; HAMi's device-type match
    of a request, e.g. ``NVIDIA`` in ``NVIDIA-Tesla T4``), in the given order."""
    word = kind.lower()
    return [d for d in devices if word in d.info.type.lower()]


def fit_shares(devices: Sequence[DeviceState], request: ContainerDeviceRequest,
               pod: PodOptions, node: NodeOptions,
               quota_ok: QuotaCheck | None = None) -> FitOutcome:
    """Choose ``request.nums`` distinct cards among ``devices``, HAMi v2.10 (NVIDIA's
    ``Fit``, which HAMi's share vendors repeat).

    ``devices`` are the vendor's cards of the requested type (:func:`of_type` where the
    vendor matches types), best first; grants carry ``request.type``. ``pod`` holds the
    pod's values of the vendor's filters (:meth:`PodOptions.from_annotations`).
    ``quota_ok(collected + [candidate])`` decides the quota step (10); None skips it.
    Returns a :class:`FitOutcome`; the reason on failure is a ``GenReason`` string over
    ``devices``, or ``NodeInsufficientDevice``.
    """
    typed = devices
    mig_request = (pod.mig and (pod.vgpu_mode is None or MODE_MIG in pod.vgpu_mode)
                   and any(d.info.mode == MODE_MIG for d in typed))
    if request.nums > len(typed) and not mig_request:
        return FitOutcome(False, reason=NODE_INSUFFICIENT_DEVICE)
    # MIG instances carry their placements in ``mig``; the topology pick chooses a subset
    # of collected cards after the loop, which would orphan those placements (and the loop
    # would collect every free instance first). A MIG request therefore takes cards in
    # order (docs/decisions.md).
    topology = policy_contains(pod.gpu_policy, "topology-aware") and not mig_request
    mutex = policy_contains(pod.gpu_policy, "mutex")
    need = request.nums
    cores = min(request.cores_percent, 100)
    counts: Counter[str] = Counter()
    collected: list[ContainerDevice] = []
    mig: list[tuple[int, str, MigPlacement]] = []
    prev_numa = -1
    i = 0
    while i < len(typed):
        dev = typed[i]
        i += 1
        info = dev.info
        if not info.health:
            counts[CARD_NOT_HEALTH] += 1
            continue
        if info.uuid in node.cordoned:
            counts[CARD_CORDONED] += 1
            continue
        if not (pod.type_ok(info.type) and pod.mode_ok(info.mode)):
            counts[CARD_TYPE_MISMATCH] += 1
            continue
        if pod.numa_bind and info.numa != prev_numa:
            if collected:
                counts[NUMA_NOT_FIT] += len(collected)
            need, prev_numa, collected, mig = request.nums, info.numa, [], []
        if not pod.uuid_ok(info.uuid):
            counts[CARD_UUID_MISMATCH] += 1
            continue
        if info.split_count <= dev.used_slots:
            counts[CARD_TIME_SLICING_EXHAUSTED] += 1
            continue
        if mutex and dev.used_slots > 0:
            counts[EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            continue
        memory = request.memory_on(info.memory_mib)
        candidate = ContainerDevice(info.uuid, request.type, memory, cores, info.index)
        if quota_ok is not None and not quota_ok([*collected, candidate]):
            counts[RESOURCE_QUOTA_NOT_FIT] += 1
            continue
        if info.memory_mib - dev.used_memory_mib < memory:
            counts[CARD_INSUFFICIENT_MEMORY] += 1
            continue
        if info.cores_percent - dev.used_cores < cores:
            counts[CARD_INSUFFICIENT_CORE] += 1
            continue
        if info.cores_percent == 100 and cores == 100 and dev.used_slots > 0:
            counts[EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            continue
        if info.cores_percent != 0 and dev.used_cores == info.cores_percent and cores == 0:
            counts[CARD_COMPUTE_UNITS_EXHAUSTED] += 1
            continue
        if pod.mig and info.mode == MODE_MIG:
            instance = _mig_instance(dev, collected, memory)
            if instance is None:
                counts[CARD_MIG_TOPOLOGY_INFEASIBLE] += 1
                continue
            profile_name, placement, memory, mig_cores = instance
            candidate = ContainerDevice(info.uuid, request.type, memory, mig_cores, info.index)
            mig.append((len(collected), profile_name, placement))
            i -= 1  # a MIG GPU may give this container several instances (HAMi v2.10)
        collected.append(candidate)
        if not topology:
            need -= 1
            if need == 0:
                return FitOutcome(True, tuple(collected), mig=tuple(mig))
    if topology and len(collected) >= request.nums:
        return FitOutcome(True, _topology_pick(collected, request.nums, node.pair_scores))
    if collected:
        counts[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += len(collected)
    return FitOutcome(False, reason=gen_reason(counts, len(typed)))


def _mig_instance(dev: DeviceState, collected: Sequence[ContainerDevice],
                  memory_mib: int) -> tuple[str, MigPlacement, int, int] | None:
    """The MIG rule (HAMi v2.10): replay this container's instances already taken on this
    GPU, then find one for ``memory_mib``. Returns ``(profile, placement, profile memory,
    profile cores)`` or None."""
    profiles = dev.info.mig_profiles
    mine = [c.used_memory_mib for c in collected if c.uuid == dev.info.uuid]
    taken = replay(profiles, dev.mig_occupied, mine)
    if taken is None:
        return None
    chosen = choose_instance(profiles, taken, memory_mib)
    if chosen is None:
        return None
    profile, placement = chosen
    return profile.name, placement, profile.memory_mib, profile.cores_percent


def _pair(scores: Mapping[str, Mapping[str, int]], a: str, b: str) -> int:
    return scores.get(a, {}).get(b, 0)


def _topology_pick(collected: list[ContainerDevice], nums: int,
                   scores: Mapping[str, Mapping[str, int]]) -> tuple[ContainerDevice, ...]:
    """Topology-aware choice (HAMi v2.10 after the loop): one card -> the one least linked
    to the others; several -> the first combination with the highest pair-score sum.
    Pair scores may be negative (HAMi's score annotation allows it): the best combination
    is then the least negative one, never none."""
    if len(collected) == nums:
        return tuple(collected)
    if nums == 1:
        def linked(c: ContainerDevice) -> int:
            return sum(_pair(scores, c.uuid, o.uuid) for o in collected if o is not c)
        return (min(collected, key=linked),)
    best: tuple[ContainerDevice, ...] = ()
    best_score: int | None = None
    for combo in combinations(collected, nums):
        total = sum(_pair(scores, a.uuid, b.uuid) for a, b in combinations(combo, 2))
        if best_score is None or total > best_score:
            best, best_score = combo, total
    return best
