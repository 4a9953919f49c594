"""MIG geometry and Allocate's MIG plan (HAMi-core 1.2 and HAMi v2.10). Pure.

* Registration: :func:`gpu_profiles` turns a GPU's NVML GI profiles and the
  ``migProfileAllowlist`` into the ``count`` and ``migProfiles`` of its register entry.
* Allocate: :func:`plan_mig` pairs the kubelet's container requests with the pod's
  ``hami.io/vgpu-devices-to-allocate`` entries and ``hami.io/vgpu-mig-allocations``
  reservations; :func:`written_back` fills in the runtime identity of the instances
  created for them.
* Reconciler: :func:`references` collects what live pods reserve, so that
  :class:`~hami.deviceplugin.mig.MigManager` keeps those instances and destroys the rest.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami.core.codec import CodecError, encode_pod_devices
from hami.core.codec_mig import (
    MigAllocation,
    MigRuntimeIdentity,
    decode_mig_allocations,
    encode_mig_allocations,
)
from hami.core.model import MigPlacement, MigProfile
from hami.deviceplugin.config import MigAllowEntry
from hami.deviceplugin.migdriver import GiProfileInfo, MigInstance
from hami.deviceplugin.podview import DEVICES_TO_ALLOCATE, AllocateError, PodView, decode_entries

log = logging.getLogger(__name__)

#: Pod annotation the scheduler writes for MIG pods (HAMi v2.10).
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
#: Pod phases whose containers are gone.
_DONE_PHASES = ("Succeeded", "Failed")


def profile_slices(name: str) -> int | None:
    """``<N>`` of a ``<N>g.<anything>`` profile name; None when the name has no such
    prefix (then no NVML profile matches it)."""
    head = name.split(".", 1)[0]
    if "." not in name or len(head) < 2 or not head.endswith("g") or not head[:-1].isdigit():
        return None
    return int(head[:-1])


# --- registration (HAMi v2.10) ------------------------------------------------------------------


def allow_entry(model: str, allowlist: Sequence[MigAllowEntry]) -> MigAllowEntry | None:
    """The first allowlist entry with a model that is a substring of ``model``."""
    return next((e for e in allowlist if any(m in model for m in e.models)), None)


def gpu_profiles(model: str, infos: Sequence[GiProfileInfo],
                 allowlist: Sequence[MigAllowEntry]) -> tuple[int, tuple[MigProfile, ...]]:
    """``(count, migProfiles)`` to register for one GPU (HAMi v2.10).

    The profiles are those of the first allowlist entry matching ``model`` (NVML name),
    in allowlist order, that the GPU supports: the name prefix ``<N>g`` selects the
    NVML GI profile with ``slices == N``; ``memoryMB`` = its NVML memory (MiB);
    ``core = ceil(SMs x 100 / max SMs over the GPU's profiles)``; ``sliceCount`` = N;
    placements = NVML's possible placements. ``count`` = the largest instance count among
    them. ``(0, ())`` when no entry matches or no listed profile is supported.
    """
    entry = allow_entry(model, allowlist)
    if entry is None or not infos:
        return 0, ()
    max_sms = max(i.multiprocessors for i in infos) or 1
    by_slices = {i.slices: i for i in infos}
    profiles, count = [], 0
    for name in entry.profiles:
        slices = profile_slices(name)
        info = by_slices.get(slices) if slices is not None else None
        if info is None:
            continue
        profiles.append(MigProfile(name, info.memory_mib,
                                   math.ceil(info.multiprocessors * 100 / max_sms),
                                   info.slices, info.placements))
        count = max(count, info.instance_count)
    return (count, tuple(profiles)) if profiles else (0, ())


# --- Allocate planning (pure) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigContainerPlan:
    """One kubelet container request: the pod entry it takes and its reservations, in
    device order."""

    entry_index: int
    allocations: tuple[MigAllocation, ...]


@dataclass(frozen=True, slots=True)
class MigPlan:
    """What one Allocate realizes, and the pod's ``to-allocate`` value afterwards."""

    containers: tuple[MigContainerPlan, ...]
    to_allocate: str
    complete: bool


def pod_mig_allocations(pod: PodView) -> tuple[MigAllocation, ...]:
    """The pod's ``hami.io/vgpu-mig-allocations``. Raises :class:`AllocateError`."""
    try:
        return decode_mig_allocations(pod.annotations.get(MIG_ALLOCATIONS, ""))
    except CodecError as exc:
        raise AllocateError(f"{pod.namespace}/{pod.name}: bad {MIG_ALLOCATIONS}: {exc}") from None


def plan_mig(pod: PodView, requests: Sequence[Sequence[str]],
             profiles: Mapping[str, tuple[int, tuple[MigProfile, ...]]]) -> MigPlan:
    """Pair each kubelet request with the pod's next non-empty device entry (init
    containers first) and that entry's MIG reservations ``(entry, device)``.

    Checks: device counts match; every device has a reservation on the same GPU; the
    GPU is a MIG GPU of this node (``profiles``); the profile is registered for it and
    the placement is one of its placements. Raises :class:`AllocateError`.
    """
    entries = list(decode_entries(pod))
    allocations = pod_mig_allocations(pod)
    reservations = {(a.container_index, a.device_index): a for a in allocations}
    who = f"{pod.namespace}/{pod.name}"
    _check_disjoint(who, allocations)
    out = []
    for ids in requests:
        idx = next((i for i, c in enumerate(entries) if c), None)
        if idx is None:
            raise AllocateError(f"{who}: no devices left to allocate")
        devices = entries[idx]
        if len(devices) != len(ids):
            raise AllocateError(f"{who}: kubelet asks for {len(ids)} devices, the scheduler "
                                f"granted {len(devices)} to container entry {idx}")
        chosen = tuple(_reservation(who, idx, d, dev.uuid, reservations, profiles)
                       for d, dev in enumerate(devices))
        out.append(MigContainerPlan(idx, chosen))
        entries[idx] = ()
    try:
        value = encode_pod_devices(tuple(entries))
    except (CodecError, ValueError) as exc:
        raise AllocateError(f"cannot re-encode {DEVICES_TO_ALLOCATE}: {exc}") from None
    return MigPlan(tuple(out), value, complete=not any(entries))


def _check_disjoint(who: str, allocations: Sequence[MigAllocation]) -> None:
    """Raise :class:`AllocateError` when two reservations overlap on one GPU."""
    for n, x in enumerate(allocations):
        for y in allocations[n + 1:]:
            if x.gpu_uuid == y.gpu_uuid and x.placement.overlaps(y.placement):
                raise AllocateError(
                    f"{who}: MIG allocations of container {x.container_index} device "
                    f"{x.device_index} and container {y.container_index} device "
                    f"{y.device_index} overlap on {x.gpu_uuid} (one instance cannot serve two)")


def _reservation(who: str, idx: int, d: int, gpu_uuid: str,
                 reservations: Mapping[tuple[int, int], MigAllocation],
                 profiles: Mapping[str, tuple[int, tuple[MigProfile, ...]]]) -> MigAllocation:
    """The reservation of device ``d`` of container entry ``idx`` (granted on
    ``gpu_uuid``), checked against this node's MIG GPUs. Raises :class:`AllocateError`."""
    a = reservations.get((idx, d))
    if a is None:
        raise AllocateError(f"{who}: no MIG allocation for container {idx} device {d}")
    if a.gpu_uuid != gpu_uuid:
        raise AllocateError(f"{who}: MIG allocation for container {idx} device {d} "
                            f"is on {a.gpu_uuid}, the device entry on {gpu_uuid}")
    if a.gpu_uuid not in profiles:
        raise AllocateError(f"{who}: {a.gpu_uuid} is not a MIG GPU of this node")
    prof = next((p for p in profiles[a.gpu_uuid][1] if p.name == a.profile), None)
    if prof is None:
        raise AllocateError(f"{who}: profile {a.profile} is not registered for {a.gpu_uuid}")
    if a.placement not in prof.placements:
        raise AllocateError(f"{who}: placement {a.placement.start}+{a.placement.size} "
                            f"is not a {a.profile} placement")
    return a


def written_back(value: str, realized: Mapping[tuple[int, int], MigInstance]) -> str:
    """``hami.io/vgpu-mig-allocations`` with the runtime identity of ``realized``
    (keyed by ``(containerIndex, deviceIndex)``) filled in. Raises ``CodecError``."""
    out = []
    for a in decode_mig_allocations(value):
        inst = realized.get((a.container_index, a.device_index))
        if inst is not None:
            a = MigAllocation(a.container_index, a.device_index, a.gpu_uuid, a.profile,
                              a.placement, MigRuntimeIdentity(inst.mig_uuid, inst.gpu_instance_id,
                                                              inst.compute_instance_id))
        out.append(a)
    return encode_mig_allocations(out)


@dataclass(frozen=True, slots=True)
class Claim:
    """One live reservation: which pod (``owner`` = ``(uid, "ns/name")``) holds which
    placement with how many slices (None when the profile name is not ``<N>g.``) and,
    once realized, which GPU instance id."""

    owner: tuple[str, str]
    placement: MigPlacement
    slices: int | None
    gpu_instance_id: int | None


@dataclass
class References:
    """What live pods reserve on each GPU (:class:`Claim` lists by GPU UUID)."""

    claims: dict[str, list[Claim]] = field(default_factory=dict)

    def keeps(self, inst: MigInstance) -> bool:
        """True when a live reservation is this instance: the same placement and slice
        count and, when the reservation is realized, the same GPU instance id. (An id alone
        is not enough: ids are reused after an instance disappears; a placement alone is
        not enough: another profile may sit there.)"""
        return any(c.placement == inst.placement
                   and (c.slices is None or c.slices == inst.slices)
                   and (c.gpu_instance_id is None or c.gpu_instance_id == inst.gpu_instance_id)
                   for c in self.claims.get(inst.gpu_uuid, ()))

    def held_by_others(self, gpu_uuid: str, placement: MigPlacement,
                       uid: str) -> list[Claim]:
        """Other pods' reservations on ``gpu_uuid`` overlapping ``placement``."""
        return [c for c in self.claims.get(gpu_uuid, ())
                if c.owner[0] != uid and c.placement.overlaps(placement)]


def references(pods: Sequence[PodView]) -> References:
    """Collect MIG reservations of pods not yet Succeeded/Failed (undecodable annotations
    are skipped: the plugin never created instances for them)."""
    refs = References()
    for p in pods:
        if p.phase in _DONE_PHASES or MIG_ALLOCATIONS not in p.annotations:
            continue
        try:
            allocs = decode_mig_allocations(p.annotations[MIG_ALLOCATIONS])
        except CodecError as exc:
            log.warning("%s/%s: ignoring bad %s: %s", p.namespace, p.name, MIG_ALLOCATIONS, exc)
            continue
        for a in allocs:
            refs.claims.setdefault(a.gpu_uuid, []).append(Claim(
                (p.uid, f"{p.namespace}/{p.name}"), a.placement, profile_slices(a.profile),
                a.runtime.gpu_instance_id if a.runtime is not None else None))
    return refs
