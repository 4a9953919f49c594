"""NVIDIA ``Fit``: can one container's request be met on one node, and with which GPUs?

Source (HAMi v2.10): (fitInDevices), (the exact check
order), (reason tokens and ``GenReason``). Devices come in best-first order (the GPU
policy's ranking, :mod:`hami.core.score`); HAMi walks a worst-first list from its end,
which is the same thing.

A container's N devices are N distinct physical GPUs: a GPU is visited once per
container (field case B24). MIG is not handled here (it needs no device revisits in the
``hami-core`` mode this module serves).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from hami.api import names
from hami.core.codec_scores import decode_node_scores
from hami.core.gowire import CodecError
from hami.core.mig import choose_instance, replay
from hami.core.model import ContainerDevice, ContainerDeviceRequest, DeviceInfo, MigPlacement

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

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}


@dataclass(slots=True)
class DeviceState:
    """A GPU with the usage seen by the pod being placed (a working copy)."""

    info: DeviceInfo
    used_slots: int
    used_memory_mib: int
    used_cores: int
    mig_occupied: list[MigPlacement] = field(default_factory=list)


def _csv(value: str | None, lower: bool = False) -> tuple[str, ...]:
    if not value or not value.strip():
        return ()
    items = (p.strip() for p in value.split(","))
    return tuple(p.lower() if lower else p for p in items if p)


def policy_contains(policy: str, word: str) -> bool:
    """HAMi ``PolicyContains``: ``word`` is one of the comma-separated entries."""
    return word in (p.strip() for p in policy.split(","))


@dataclass(frozen=True, slots=True)
class PodOptions:
    """A pod's device options from its annotations (HAMi v2.10), parsed once per filter."""

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    numa_bind: bool = False
    vgpu_mode: str | None = None
    gpu_policy: str = "spread"

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str], gpu_policy: str) -> PodOptions:
        """Parse ``nvidia.com/use-gputype`` ... ``nvidia.com/vgpu-mode``; ``gpu_policy`` is
        the effective GPU policy (annotation override already applied)."""
        return cls(
            use_types=_csv(annotations.get(names.USE_GPUTYPE), lower=True),
            nouse_types=_csv(annotations.get(names.NOUSE_GPUTYPE), lower=True),
            use_uuids=frozenset(_csv(annotations.get(names.USE_GPUUUID))),
            nouse_uuids=frozenset(_csv(annotations.get(names.NOUSE_GPUUUID))),
            numa_bind=annotations.get(names.NUMA_BIND, "") in _TRUE,
            vgpu_mode=annotations.get(names.VGPU_MODE),
            gpu_policy=gpu_policy,
        )

    def type_ok(self, device_type: str) -> bool:
        """``CheckType`` (case-insensitive substrings) and the ``vgpu-mode`` filter."""
        t = device_type.lower()
        if self.use_types and not any(u in t for u in self.use_types):
            return False
        return not any(n in t for n in self.nouse_types)

    def mode_ok(self, device_mode: str) -> bool:
        """The device's mode is allowed by ``nvidia.com/vgpu-mode`` (contains)."""
        return self.vgpu_mode is None or (device_mode or names.MODE_HAMI_CORE) in self.vgpu_mode

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
    def from_annotations(cls, annotations: Mapping[str, str]) -> NodeOptions:
        """From a node's annotations: ``hami.io/device-cordon`` (comma list, trimmed) and
        ``hami.io/node-nvidia-score`` (a malformed value counts as no scores)."""
        cordon = annotations.get(names.NODE_DEVICE_CORDON, "")
        cordoned = frozenset(p.strip() for p in cordon.split(",") if p.strip())
        scores: Mapping[str, Mapping[str, int]] = {}
        raw = annotations.get(names.NODE_SCORE)
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


def fit_container(devices: Sequence[DeviceState], request: ContainerDeviceRequest,
                  pod: PodOptions, node: NodeOptions,
                  quota_ok: QuotaCheck | None = None) -> FitOutcome:
    """Choose ``request.nums`` distinct GPUs among ``devices`` (best first), HAMi v2.10.

    ``quota_ok(collected + [candidate])`` decides the quota step (10); None skips it.
    Returns a :class:`FitOutcome`; the reason on failure is a ``GenReason`` string over the
    type-matching devices, or ``NodeInsufficientDevice``.
    """
    typed = [d for d in devices if request.type.lower() in d.info.type.lower()]
    mig_request = (request.type == names.NVIDIA
                   and (pod.vgpu_mode is None or names.MODE_MIG in pod.vgpu_mode)
                   and any(d.info.mode == names.MODE_MIG for d in typed))
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
        if not (pod.type_ok(info.type) and pod.mode_ok(info.mode)
                and request.type == names.NVIDIA):
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
        candidate = ContainerDevice(info.uuid, names.NVIDIA, memory, cores, info.index)
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
        if info.mode == names.MODE_MIG:
            instance = _mig_instance(dev, collected, memory)
            if instance is None:
                counts[CARD_MIG_TOPOLOGY_INFEASIBLE] += 1
                continue
            profile_name, placement, memory, mig_cores = instance
            candidate = ContainerDevice(info.uuid, names.NVIDIA, memory, mig_cores, info.index)
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
